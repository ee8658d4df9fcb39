"""Registered jobs, their policy decisions and flows; per-EP full resync. Thread-safe; no OpenFlow here."""
from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from dataclasses import dataclass, field

from ..errors import LarkError
from . import hairpin, labels
from .config import ControllerConfig
from .flows import Decision, Flow, decide, job_flows, wan_port
from .model import JobReg, OverQuota, Refused
from .wan import WanPlan

log = logging.getLogger(__name__)


@dataclass(slots=True)
class Entry:
    job: JobReg
    decision: Decision
    flows: list[Flow]
    cookie: int
    registered: float = field(default_factory=time.time)
    label: tuple[int, int] | None = None    # [labels] mode = "vlan": (VLAN id, PCP) the EP tags the job's frames with

    def summary(self) -> dict:
        d = self.decision
        return {**self.job.to_dict(), "cookie": f"{self.cookie:#018x}", "flows": len(self.flows),
                "blocked_by": d.blocked_by, "slice": d.slice_name, "wan_policy": d.wan_policy,
                "registered": self.registered,
                **({"label": {"vid": self.label[0], "pcp": self.label[1]}} if self.label is not None else {})}


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
        self._labelled = cfg.labels_mode == "vlan"
        self._singling = {p.name for p in cfg.policies if labels.singles_out(p)}
        self._vid_of: dict[str, int] = {}      # label scheme: slice name -> its VLAN id (kept while the process runs)
        self._slice_of_vid: dict[int, str] = {}
        self._lock = threading.Lock()
        self.synced_eps: dict[str, float] = {}
        # MAC or address -> the job holding it: another EP's registration of either is refused (its flows would
        # replace that job's on the switch: same table, priority and match)
        self._holder: dict[str, tuple[str, str]] = {}
        self._per_ep: Counter[str] = Counter()   # registered jobs per EP, for its quota
        # each EP's jobs: a resync looks up its EP's, not every job in the pool (1,000 EPs x 100,000 jobs, issue 26)
        self._by_ep: dict[str, set[tuple[str, str]]] = {}
        if not cfg.eps:
            log.warning("the controller config has no [ep.NAME] sections: every EP may register jobs with any "
                        "address, from any switch port (docs/controller.md, 'Who may register what')")

    def _check(self, job: JobReg) -> None:
        """Refuse a job its EP may not register (Refused: the API answers 403 with the reason). The EP's own jobs
        never stand in its way: what it registers replaces them on the switch, as it should."""
        scope = self.cfg.scope(job.ep)
        if self.cfg.eps and scope is None:
            raise Refused("this EP has no [ep.NAME] section in the controller config", job=job.job_id,
                          obj=f"registration from {job.ep}",
                          fix=f"add [ep.{job.ep}] with its switch ports and job addresses (docs/controller.md)")
        outside = [a for a in job.addresses if scope is not None and not scope.holds(a)]
        if scope is not None and outside:
            raise Refused(f"address {outside[0]} is not one of this EP's ({', '.join(map(str, scope.networks))})",
                          job=job.job_id, obj=f"registration from {job.ep}",
                          fix=f"larkd's bridge_range on {job.ep} must lie in [ep.{job.ep}] addresses")
        for what in (job.mac, *job.addresses):
            holder = self._holder.get(what)
            if holder is not None and holder[0] != job.ep:
                other = self._jobs[holder].job
                raise Refused(f"{what} belongs to job {other.job_id} of EP {other.ep}", job=job.job_id,
                              obj=f"registration from {job.ep}",
                              fix="an EP registers only its own jobs' MACs and addresses; if that job is gone, its "
                                  "EP's next resync (or its larkd's restart) frees them")

    def _ports(self, job: JobReg) -> list[str]:
        scope = self.cfg.scope(job.ep)
        return scope.ports if scope is not None else []

    def _quota(self, ep: str) -> int:
        scope = self.cfg.scope(ep)
        return scope.max_jobs if scope is not None else self.cfg.max_jobs_per_ep

    def _drop(self, ident: tuple[str, str]) -> Entry | None:
        e = self._jobs.pop(ident, None)
        if e is not None:
            self._per_ep[ident[0]] -= 1
            self._by_ep[ident[0]].discard(ident)
            for what in (e.job.mac, *e.job.addresses):
                if self._holder.get(what) == ident:
                    del self._holder[what]
        return e

    def _entry(self, job: JobReg) -> Entry:
        d = decide(job, self.cfg, self._exprs)
        if d.slice_id:
            other = self._slices.get(d.slice_id)
            if other is not None and other != d.slice_name:
                raise LarkError(f"slice {d.slice_name!r} hashes to the same id as slice {other!r}", job=job.job_id,
                                obj="per-user slices", fix="rename one of the slice policies (the id is a hash)")
        # into its group's WAN limit on the port its WAN traffic leaves by (issue 12)
        wan = self.wan.job_flows(job, wan_port(d)) if not d.blocked_by else []
        if self._labelled and job.tagged:
            # per-job entries only for a drop policy that singles out jobs (and WAN group limits, still per job).
            # A job its EP does not tag (a Linux-bridge job) gets the per-job flows below: untagged, its frames
            # would pass the core as a host's, outside its drop or slice policy.
            own = job_flows(job, d, self._ports(job)) if d.blocked_by in self._singling else []
            return Entry(job, d, own + wan, job.cookie, label=self._label(job, d))
        same_ep = hairpin.job_flows(job, self.cfg) if not d.blocked_by else []   # back to its isolated EP
        return Entry(job, d, job_flows(job, d, self._ports(job)) + wan + same_ep, job.cookie)

    def _label(self, job: JobReg, d: Decision) -> tuple[int, int]:
        """The job's (VLAN id, PCP): its slice's VLAN (allocated on first use, a stable hash first), COMMON_VID
        without a slice, BLOCKED_VID when dropped; the PCP is its WAN action."""
        if d.blocked_by:
            return (labels.BLOCKED_VID, 0)
        if not d.slice_name:
            return (labels.COMMON_VID, d.wan_action)
        vid = self._vid_of.get(d.slice_name)
        if vid is None:
            vid = next((v for v in labels.vid_probe(d.slice_name) if v not in self._slice_of_vid), None)
            if vid is None:
                raise Refused(f"all {len(self._slice_of_vid)} slice VLAN ids are in use", job=job.job_id,
                              obj=f"slice {d.slice_name!r}", fix="fewer slices, or [labels] mode = \"off\"")
            self._vid_of[d.slice_name], self._slice_of_vid[vid] = vid, d.slice_name
        return (vid, d.wan_action)

    def _put(self, e: Entry, ch: Change) -> None:
        old = self._jobs.get(e.job.ident)
        unchanged = (old is not None and old.cookie == e.cookie and old.flows == e.flows
                     and old.label == e.label)
        if old is not None:
            self._drop(old.job.ident)
            if unchanged:
                old.job, e = e.job, old     # nothing to send; the index below takes its new addresses
            else:
                ch.remove.append(old)
        self._jobs[e.job.ident] = e
        self._per_ep[e.job.ep] += 1
        self._by_ep.setdefault(e.job.ep, set()).add(e.job.ident)
        for what in (e.job.mac, *e.job.addresses):
            self._holder[what] = e.job.ident
        if unchanged:
            return
        if e.decision.slice_id:
            self._slices[e.decision.slice_id] = e.decision.slice_name
        ch.install.append(e)

    def register(self, job: JobReg) -> tuple[Entry, Change]:
        with self._lock:
            ch = Change()
            self._check(job)
            if job.ident not in self._jobs and self._per_ep[job.ep] >= self._quota(job.ep):
                raise OverQuota(f"this EP has {self._quota(job.ep)} jobs registered, its quota",
                                job=job.job_id, obj=f"registration from {job.ep}",
                                fix=f"raise max_jobs in [ep.{job.ep}] (or [api] max_jobs_per_ep) if the EP really "
                                    "runs that many bridged jobs at once")
            e = self._entry(job)
            self._put(e, ch)
            return self._jobs[job.ident], ch

    def unregister(self, ep: str, key: str) -> Entry | None:
        with self._lock:
            return self._drop((ep, key))

    def sync(self, ep: str, jobs: list[JobReg]) -> Change:
        """Make the EP's jobs exactly `jobs` (larkd's full list after a restart on either side)."""
        with self._lock:
            ch = Change()
            if len({j.ident for j in jobs}) > self._quota(ep):
                raise OverQuota(f"a resync of {len(jobs)} jobs is over this EP's quota of {self._quota(ep)}",
                                obj=f"resync from {ep}", fix=f"raise max_jobs in [ep.{ep}] (or [api] max_jobs_per_ep)")
            mine = set(self._by_ep.get(ep, ()))
            for j in jobs:
                self._check(j)
            entries = [self._entry(j) for j in jobs]   # all validated before anything changes
            keep = {j.ident for j in jobs}
            for ident in [i for i in mine if i not in keep]:
                removed = self._drop(ident)
                if removed is not None:
                    ch.remove.append(removed)
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
