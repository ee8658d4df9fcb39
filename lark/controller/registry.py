"""Registered jobs, their policy decisions and flows; per-EP full resync. Thread-safe; no OpenFlow here."""
from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field

from ..errors import LarkError
from . import hairpin
from .config import ControllerConfig
from .flows import Decision, Flow, decide, job_flows, wan_port
from .model import JobReg
from .wan import WanPlan

log = logging.getLogger(__name__)


@dataclass
class Entry:
    job: JobReg
    decision: Decision
    flows: list[Flow]
    cookie: int
    registered: float = field(default_factory=time.time)

    def summary(self) -> dict:
        d = self.decision
        return {**self.job.to_dict(), "cookie": f"{self.cookie:#018x}", "flows": len(self.flows),
                "blocked_by": d.blocked_by, "slice": d.slice_name, "wan_policy": d.wan_policy,
                "registered": self.registered}


@dataclass
class Change:
    """What a registration or resync changed: flows to remove (by cookie) and entries to install."""
    remove: list[Entry] = field(default_factory=list)
    install: list[Entry] = field(default_factory=list)


class Registry:
    def __init__(self, cfg: ControllerConfig):
        self.cfg = cfg
        self._exprs = {p.name: p.expr() for p in cfg.policies}
        self.wan = WanPlan(cfg.wan_groups, cfg.wan_unmatched, cfg.wan_mechanism, cfg.wan_ports)
        self._jobs: dict[tuple[str, str], Entry] = {}
        self._slices: dict[int, str] = {}      # slice id -> name, to refuse a (2^-32) hash collision
        self._lock = threading.Lock()
        self.synced_eps: dict[str, float] = {}

    def _entry(self, job: JobReg) -> Entry:
        d = decide(job, self.cfg, self._exprs)
        if d.slice_id:
            other = self._slices.get(d.slice_id)
            if other is not None and other != d.slice_name:
                raise LarkError(f"slice {d.slice_name!r} hashes to the same id as slice {other!r}", job=job.job_id,
                                obj="per-user slices", fix="rename one of the slice policies (the id is a hash)")
        # into its group's WAN limit on the port its WAN traffic leaves by (issue 12)
        wan = self.wan.job_flows(job, wan_port(d)) if not d.blocked_by else []
        same_ep = hairpin.job_flows(job, self.cfg) if not d.blocked_by else []   # back to its isolated EP
        return Entry(job, d, job_flows(job, d) + wan + same_ep, job.cookie)

    def _put(self, e: Entry, ch: Change) -> None:
        old = self._jobs.get(e.job.ident)
        if old is not None:
            if old.cookie == e.cookie and old.flows == e.flows:
                old.job = e.job
                return
            ch.remove.append(old)
        self._jobs[e.job.ident] = e
        if e.decision.slice_id:
            self._slices[e.decision.slice_id] = e.decision.slice_name
        ch.install.append(e)

    def register(self, job: JobReg) -> tuple[Entry, Change]:
        with self._lock:
            ch = Change()
            e = self._entry(job)
            self._put(e, ch)
            return self._jobs[job.ident], ch

    def unregister(self, ep: str, key: str) -> Entry | None:
        with self._lock:
            return self._jobs.pop((ep, key), None)

    def sync(self, ep: str, jobs: list[JobReg]) -> Change:
        """Make the EP's jobs exactly `jobs` (larkd's full list after a restart on either side)."""
        with self._lock:
            ch = Change()
            entries = [self._entry(j) for j in jobs]   # all validated before anything changes
            keep = {j.ident for j in jobs}
            for ident in [i for i in self._jobs if i[0] == ep and i not in keep]:
                ch.remove.append(self._jobs.pop(ident))
            for e in entries:
                self._put(e, ch)
            self.synced_eps[ep] = time.time()
            return ch

    def entries(self) -> list[Entry]:
        with self._lock:
            return list(self._jobs.values())

    def wan_limits_needed(self) -> dict[tuple[int, int], int]:
        """WAN limit (group, port) -> number of registered jobs whose flows name it: what the meters or queues
        on the switches must provide, whichever the mechanism."""
        out: dict[tuple[int, int], int] = {}
        for e in self.entries():
            for lim in self.wan.limits_in(e.flows):
                out[lim] = out.get(lim, 0) + 1
        return out

    def cookies(self) -> set[int]:
        with self._lock:
            return {e.cookie for e in self._jobs.values()}

    def __len__(self) -> int:
        return len(self._jobs)
