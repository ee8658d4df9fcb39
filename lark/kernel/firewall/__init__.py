"""Firewall drivers behind one interface; `make_firewall` picks the one named in config."""
from __future__ import annotations

import dataclasses

from ...config import Config
from ..sections import FirewallSection
from .base import Counters, Firewall

BACKENDS = ("nftables", "iptables")


def make_firewall(cfg: Config) -> Firewall:
    """The driver `cfg.firewall` names, given only its section of the configuration (lark/kernel/sections.py)."""
    section = FirewallSection.from_config(cfg)
    if cfg.firewall == "iptables":
        from .iptables import IptablesFirewall
        return IptablesFirewall(section)
    from .nftables import NftablesFirewall
    return NftablesFirewall(section)


def other_firewalls(cfg: Config) -> list[Firewall]:
    """Drivers for the backends the config does not choose: gc removes what a former setting left there."""
    return [make_firewall(dataclasses.replace(cfg, firewall=b)) for b in BACKENDS if b != cfg.firewall]


__all__ = ["BACKENDS", "Counters", "Firewall", "make_firewall", "other_firewalls"]
