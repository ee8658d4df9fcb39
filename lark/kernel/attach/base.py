"""The attach-mode interface every mode implements (the plan says which one a job gets)."""
from __future__ import annotations

import abc
import threading
from typing import ClassVar

from pyroute2 import IPRoute

from ...names import JobNames
from ...plan import JobNetwork
from ..drift import Finding
from ..firewall.base import ROUTED
from ..ipam import LockPool, range_pool, range_pool6
from ..sections import BridgedSection, Section


class AttachMode(abc.ABC):
    name = "abstract"
    bridged = False        # True: the job is a station on a shared L2 network (needs its own MAC)
    counts_by_link = False  # True: traffic bypasses netfilter; the accountant reads the veth's counters
    tags_labels = False    # True: it tags the job's frames with a label-scheme controller's label (apply_label)
    firewall_rules = ROUTED  # the host firewall's rule set for its jobs (lark/kernel/firewall/base.py)
    section: ClassVar[type[Section]] = Section  # the knobs it reads (lark/kernel/sections.py); it keeps only those
    cfg: Section

    def __init__(self, cfg: Section):
        self.cfg = self.section.expect(cfg)
        self._prepare_lock = threading.Lock()

    # IPv6: None when this mode has no IPv6 configured (jobs that want it are then refused).
    pool6: LockPool | None = None
    gateway6: str | None = None
    prefix6: int = 128

    def ensure_prepared(self, ipr: IPRoute) -> None:
        # Concurrent first setups must not both create the bridge or both move the uplink's addresses.
        with self._prepare_lock:
            self.prepare(ipr)

    @property
    @abc.abstractmethod
    def pool(self) -> LockPool:
        """Where this mode's job addresses come from."""

    @property
    @abc.abstractmethod
    def gateway(self) -> str:
        """The job's default gateway."""

    @property
    @abc.abstractmethod
    def prefix(self) -> int:
        """Prefix length of the job's address."""

    def prepare(self, ipr: IPRoute) -> None:
        """Shared host objects this mode needs (a bridge, ...); idempotent and cheap when done."""

    @property
    def host_device(self) -> str | None:
        """The host's device on the jobs' network, whose address a job reaches directly (the DNS forwarder's
        route goes via it); None: the job reaches the host through its gateway route (NAT)."""
        return None

    def link_mtu(self, ipr: IPRoute) -> int | None:
        """The MTU of the network behind this mode (lark/kernel/mtu.py); None: lark/kernel/mtu.py's default. NAT
        follows the route out, the bridged modes their bridge."""
        return None

    @abc.abstractmethod
    def attach(self, ipr: IPRoute, host_idx: int, plan: JobNetwork, names: JobNames) -> None:
        """Connect the host end of the job's veth (already up) to this mode's network."""

    def wait_forwarding(self, ipr: IPRoute, host_idx: int, job: str) -> None:
        """Once the job's end of the veth is up: wait until this mode switches the job's first frame."""

    def secure(self, plan: JobNetwork, names: JobNames) -> None:
        """Per-job filtering this mode does itself, once the job's address is known (after DHCP)."""

    def detach(self, names: JobNames) -> bool:
        """Undo what `attach` and `secure` did beyond the veth (which teardown deletes); safe to repeat."""
        return False

    def verify(self, ipr: IPRoute, host_idx: int, plan: JobNetwork, names: JobNames) -> list[Finding]:
        """What `attach` and `secure` made beyond the veth, read back without changing it (`lark status --verify`)."""
        return []

    def job_keys(self) -> set[str]:
        """Keys of jobs that still have objects of this mode (for gc)."""
        return set()


class BridgedMode(AttachMode):
    """Modes that put the job on the site network: addresses from `bridge_range`, the site's gateway."""
    bridged = True
    section: ClassVar[type[Section]] = BridgedSection
    cfg: BridgedSection

    def __init__(self, cfg: BridgedSection):
        super().__init__(cfg)
        cfg = self.cfg
        first, last = (x.strip() for x in cfg.bridge_range.split("-"))
        self._pool = range_pool(cfg.ipam_dir, first, last)
        self._ready = False
        if cfg.bridge_range6:
            first6, last6 = (x.strip() for x in cfg.bridge_range6.split("-"))
            self.pool6 = range_pool6(cfg.ipam_dir, first6, last6)
            self.gateway6, self.prefix6 = cfg.bridge_gateway6, cfg.bridge_prefix6

    @property
    def pool(self) -> LockPool:
        return self._pool

    @property
    def gateway(self) -> str:
        return self.cfg.bridge_gateway

    @property
    def prefix(self) -> int:
        return self.cfg.bridge_prefix
