"""NAT: a routed point-to-point link per job; the firewall masquerades what leaves the uplink."""
from __future__ import annotations

import ipaddress

from pyroute2 import IPRoute

from ...names import JobNames
from ...plan import JobNetwork
from ..ipam import LockPool, address_pool, address_pool6
from .base import AttachMode

SCOPE_LINK = 253
IFA_F_NODAD = 0x02


class NatMode(AttachMode):
    name = "nat"

    def __init__(self, cfg):
        super().__init__(cfg)
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

    def attach(self, ipr: IPRoute, host_idx: int, plan: JobNetwork, names: JobNames) -> None:
        # The gateway address sits on every host-side veth; each job has a host route (/32, /128).
        if plan.ipv4:
            ipr.addr("add", index=host_idx, address=self.gateway, prefixlen=32)
            ipr.route("add", dst=f"{plan.ipv4}/32", oif=host_idx, scope=SCOPE_LINK)
        if plan.ipv6:
            # No duplicate address detection: it would hold the first packet back for about a second.
            ipr.addr("add", index=host_idx, address=self.gateway6, prefixlen=128, flags=IFA_F_NODAD)
            ipr.route("add", dst=f"{plan.ipv6}/128", oif=host_idx)
