"""Whether Lark's firewall confines the host's forwarding to Lark's own traffic (config `forward_policy`).

Lark turns on net.ipv4.ip_forward for NAT mode, and that makes the execution point a router for anything: a
host on the site network could route through it to any address the EP reaches. With forward_policy =
"lark-only", Lark's own table (never another) drops forwarded packets that neither come from nor go to a Lark
job interface and are not part of an established flow. "any" leaves forwarding alone (for hosts that route for
others too: Docker, VMs). "auto" (default) is "lark-only" exactly when Lark itself turned forwarding on, i.e.
it was off before larkd first started; a marker file in run_dir remembers that across larkd restarts.
"""
from __future__ import annotations

import logging
import os
from typing import Protocol

from .sections import ForwardingSection

log = logging.getLogger(__name__)
IP_FORWARD = "/proc/sys/net/ipv4/ip_forward"


class ForwardingKnobs(Protocol):
    """What lark_only reads: the firewall drivers' section or forwarding's (lark/kernel/sections.py)."""
    @property
    def run_dir(self) -> str: ...
    @property
    def forward_policy(self) -> str: ...


def marker(cfg: ForwardingKnobs) -> str:
    return os.path.join(cfg.run_dir, "ip_forward.enabled-by-lark")


def claim(cfg: ForwardingSection, sysctl: str = IP_FORWARD) -> None:
    """Call before larkd turns forwarding on: remembers that it was off, so nobody else relies on it."""
    if not cfg.enable_ip_forward:
        return
    try:
        with open(sysctl) as f:
            was_on = f.read().strip() != "0"
    except OSError as e:
        log.warning("cannot read %s (%s): treating forwarding as someone else's", sysctl, e)
        return
    if not was_on:
        os.makedirs(cfg.run_dir, exist_ok=True)
        with open(marker(cfg), "w") as f:
            f.write("ip_forward was 0 before larkd set it\n")


def lark_only(cfg: ForwardingKnobs) -> bool:
    """Whether the firewall should drop forwarding that is not Lark's."""
    if cfg.forward_policy == "lark-only":
        return True
    if cfg.forward_policy == "any":
        return False
    owned = os.path.exists(marker(cfg))
    if not owned:
        log.info("forwarding was on before larkd: other forwarded traffic is left alone (forward_policy = auto)")
    return owned
