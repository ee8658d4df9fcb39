"""Firewall drivers behind one interface; `make_firewall` picks the one named in config."""
from __future__ import annotations

from ...config import Config
from .base import Counters, Firewall


def make_firewall(cfg: Config) -> Firewall:
    if cfg.firewall == "iptables":
        from .iptables import IptablesFirewall
        return IptablesFirewall(cfg)
    from .nftables import NftablesFirewall
    return NftablesFirewall(cfg)


__all__ = ["Counters", "Firewall", "make_firewall"]
