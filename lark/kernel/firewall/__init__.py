"""Firewall drivers behind one interface; `make_firewall` picks the one named in config."""
from __future__ import annotations

import dataclasses

from ...config import Config
from .base import Counters, Firewall

BACKENDS = ("nftables", "iptables")


def make_firewall(cfg: Config) -> Firewall:
    if cfg.firewall == "iptables":
        from .iptables import IptablesFirewall
        return IptablesFirewall(cfg)
    from .nftables import NftablesFirewall
    return NftablesFirewall(cfg)


def other_firewalls(cfg: Config) -> list[Firewall]:
    """Drivers for the backends the config does not choose: gc removes what a former setting left there."""
    return [make_firewall(dataclasses.replace(cfg, firewall=b)) for b in BACKENDS if b != cfg.firewall]


__all__ = ["BACKENDS", "Counters", "Firewall", "make_firewall", "other_firewalls"]
