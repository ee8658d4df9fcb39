"""IPv6 the way the site hands it out, for bridged and OVS jobs: SLAAC from the site's router advertisements.

The job's kernel does the autoconfiguration (as it would on any host of that VLAN): larkd turns on accept_ra and
autoconf in the job's netns before its device exists (the job cannot change them: it has no CAP_NET_ADMIN there),
lets the first router solicitation through the bridge, waits for the global address, and then installs the same
anti-spoofing as for a static address (the address is EUI-64 of the job's fixed MAC, so it is known and stable).
Router advertisements, redirects and DHCPv6 server messages *from* job ports are dropped at the bridge or switch
(firewall/nftables.py `_ra_guard_bridge`, attach/ovs.py `ra_guard_flows`): only the uplink side can be a router.
"""
from __future__ import annotations

import time

from pyroute2 import IPRoute

from ..errors import LarkError
from . import netns

IFA_F_TENTATIVE = 0x40
RT_SCOPE_UNIVERSE = 0


def prepare_job_netns(ns_fd: int, autoconf: bool = True) -> None:
    """Before the job's device exists, so it inherits them: accept RAs, autoconfigure (not with DHCPv6, whose
    lease is then the device's only global address), solicit at once."""
    # Solicit again after 1 s, not the default 4: a router advertisement sent while the job's port is joining a
    # bridge that has just been created can be lost (measured: the first job's route then came ~4 s late).
    for key, value in (("accept_ra", "1"), ("autoconf", "1" if autoconf else "0"), ("router_solicitation_delay", "0"),
                       ("router_solicitation_interval", "1"),
                       ("accept_dad", "0"), ("use_tempaddr", "0")):
        netns.write_sysctl_in(ns_fd, f"net.ipv6.conf.default.{key}", value)


def slaac_address(nipr: IPRoute, idx: int) -> tuple[str, int] | None:
    """The device's first global, non-tentative IPv6 address, or None yet."""
    for a in nipr.get_addr(index=idx, family=10):
        flags = a.get_attr("IFA_FLAGS") or a["flags"]
        if a["scope"] == RT_SCOPE_UNIVERSE and not flags & IFA_F_TENTATIVE:
            return a.get_attr("IFA_ADDRESS"), a["prefixlen"]
    return None


def wait_for_slaac(nipr: IPRoute, idx: int, job: str, timeout: float) -> tuple[str, int]:
    deadline = time.monotonic() + timeout
    while True:
        got = slaac_address(nipr, idx)
        if got is not None:
            return got
        if time.monotonic() >= deadline:
            raise LarkError(f"no router advertisement with an autonomous prefix within {timeout:g} s", job=job,
                            obj="IPv6 autoconfiguration (bridge_ipv6 = \"slaac\")",
                            fix="check that the site's router advertises a /64 with the A flag on the job network, "
                                "or use bridge_ipv6 = \"static\" with bridge_range6")
        time.sleep(0.05)
