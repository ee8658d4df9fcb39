"""The attach-mode interface every mode implements (the plan says which one a job gets)."""
from __future__ import annotations

import abc

from pyroute2 import IPRoute

from ..config import Config
from ..ipam import LockPool
from ..names import JobNames
from ..plan import NetworkPlan


class AttachMode(abc.ABC):
    name = "abstract"
    bridged = False        # True: the job is a station on a shared L2 network (needs its own MAC)

    def __init__(self, cfg: Config):
        self.cfg = cfg

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

    @abc.abstractmethod
    def attach(self, ipr: IPRoute, host_idx: int, plan: NetworkPlan, names: JobNames) -> None:
        """Connect the host end of the job's veth (already up) to this mode's network."""
