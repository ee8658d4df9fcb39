"""NAT: a routed point-to-point link per job; the firewall masquerades what leaves the uplink."""
from __future__ import annotations

from pyroute2 import IPRoute

from ..ipam import LockPool, address_pool
from ..names import JobNames
from ..plan import NetworkPlan
from .base import AttachMode

SCOPE_LINK = 253


class NatMode(AttachMode):
    name = "nat"

    def __init__(self, cfg):
        super().__init__(cfg)
        self._pool = address_pool(cfg.ipam_dir, cfg.subnet)

    @property
    def pool(self) -> LockPool:
        return self._pool

    @property
    def gateway(self) -> str:
        return str(self.cfg.gateway)

    @property
    def prefix(self) -> int:
        return 32

    def attach(self, ipr: IPRoute, host_idx: int, plan: NetworkPlan, names: JobNames) -> None:
        # The gateway address sits on every host-side veth; each job has a /32 host route.
        ipr.addr("add", index=host_idx, address=self.gateway, prefixlen=32)
        ipr.route("add", dst=f"{plan.ipv4}/32", oif=host_idx, scope=SCOPE_LINK)
