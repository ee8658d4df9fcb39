"""NAT: a routed point-to-point link per job; the firewall masquerades what leaves the uplink."""
from __future__ import annotations

import ipaddress
from typing import ClassVar

from pyroute2 import IPRoute

from ...names import JobNames
from ...plan import JobNetwork
from .. import mtu
from ..drift import Finding, drifted, present
from ..ipam import LockPool, address_pool, address_pool6
from ..links import host_rtnl
from ..sections import NatSection, Section
from .base import AttachMode

SCOPE_LINK = 253
IFA_F_NODAD = 0x02


class NatMode(AttachMode):
    name = "nat"
    section: ClassVar[type[Section]] = NatSection
    cfg: NatSection

    def __init__(self, cfg: NatSection):
        super().__init__(cfg)
        cfg = self.cfg
        self._pool = address_pool(cfg.ipam_dir, cfg.subnet)
        if cfg.subnet6:
            net6 = ipaddress.IPv6Network(cfg.subnet6)
            self.pool6 = address_pool6(cfg.ipam_dir, cfg.subnet6)
            self.gateway6 = str(net6.network_address + 1)

    @property
    def pool(self) -> LockPool:
        return self._pool

    @property
    def gateway(self) -> str:
        return str(self.cfg.gateway)

    @property
    def prefix(self) -> int:
        return 32

    def link_mtu(self, ipr: IPRoute) -> int | None:
        return mtu.route_out_mtu(ipr, self.cfg.uplink)

    def attach(self, ipr: IPRoute, host_idx: int, plan: JobNetwork, names: JobNames) -> None:
        # The gateway address sits on every host-side veth; each job has a host route (/32, /128).
        raw = host_rtnl(ipr)  # four requests at ~0.2 ms each through pyroute2, ~0.01 ms raw (lark/kernel/rtnl.py)
        if plan.ipv4:
            if raw is not None:
                raw.addr_add(host_idx, self.gateway, 32)
                raw.route_add(plan.ipv4, 32, host_idx, scope=SCOPE_LINK)
            else:
                ipr.addr("add", index=host_idx, address=self.gateway, prefixlen=32)
                ipr.route("add", dst=f"{plan.ipv4}/32", oif=host_idx, scope=SCOPE_LINK)
        if plan.ipv6:
            # No duplicate address detection: it would hold the first packet back for about a second.
            if raw is not None and self.gateway6 is not None:
                raw.addr_add(host_idx, self.gateway6, 128, IFA_F_NODAD)
                raw.route_add(plan.ipv6, 128, host_idx)
            else:
                ipr.addr("add", index=host_idx, address=self.gateway6, prefixlen=128, flags=IFA_F_NODAD)
                ipr.route("add", dst=f"{plan.ipv6}/128", oif=host_idx)

    def verify(self, ipr: IPRoute, host_idx: int, plan: JobNetwork, names: JobNames) -> list[Finding]:
        """The gateway address on the host end and the host route to each of the job's addresses."""
        fix = f"something other than larkd changed addresses or routes of {names.host_if} (`ip addr/route del`)"
        found = []
        for family, addr, gateway, plen in ((2, plan.ipv4, self.gateway, 32), (10, plan.ipv6, self.gateway6, 128)):
            if not addr or not gateway:
                continue
            gw, job = ipaddress.ip_address(gateway), ipaddress.ip_address(addr)
            what = f"gateway {gateway} on {names.host_if}"
            on_dev = {ipaddress.ip_address(a.get_attr("IFA_ADDRESS"))
                      for a in ipr.get_addr(index=host_idx, family=family)}
            found.append(present(what) if gw in on_dev else drifted(what, "the job's gateway address is gone", fix))
            what = f"route {addr}/{plen} via {names.host_if}"
            routes = [r for r in ipr.get_routes(family=family, oif=host_idx) if r["dst_len"] == plen
                      and r.get_attr("RTA_DST") and ipaddress.ip_address(r.get_attr("RTA_DST")) == job]
            found.append(present(what) if routes else drifted(what, "the host's route to the job is gone", fix))
        return found
