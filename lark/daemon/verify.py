"""`lark status --verify`, CNI's CHECK: each ready job's kernel objects against its record, read-only.

Each resource's `check` (lark/daemon/resources.py, calling the `verify*` functions next to the kernel code that
makes each object) reads its object back; the job's profile names which, the same list setup builds from. This
module opens the job's netns by its name (itself the first check), runs them, and turns what they found into rows
for the admin.
"""
from __future__ import annotations

import logging
import os
from dataclasses import dataclass

from pyroute2 import IPRoute

from ..kernel.drift import Finding, drifted
from ..plan import JobNetwork
from .jobnet import JobNetworker
from .profiles import NETWORKED
from .resources import CheckCtx

log = logging.getLogger(__name__)
# larkd rebuilds nothing under a running job (the job would see its network change under it): the job gets a new
# network when it starts again.
RECOVER = "`condor_vacate_job {job}` gives the job a new network"


@dataclass
class JobCheck:
    key: str
    slot: str
    job_id: str
    findings: list[Finding]


def verify_job(net: JobNetworker, key: str) -> JobCheck | None:
    """The slot's job's objects against its record; None when the slot has no ready job (setting up, tearing down).
    The caller keeps the slot's setup and teardown out meanwhile (larkd: the slot's lock)."""
    rec = net.records.load(key)
    if rec is None or rec.phase != "ready":
        return None
    found: list[Finding] = []
    try:
        found += _verify(net, key, rec.netns_inode, rec.job_id)
    except Exception as e:  # a check that cannot read the kernel: say so instead of claiming a match
        log.error("verify of job %s on %s failed: %s", rec.job_id, rec.slot, e)
        found.append(drifted(f"job key {key}", f"could not be checked: {e}", "see larkd's log"))
    return JobCheck(key, rec.slot, rec.job_id, found)


def _verify(net: JobNetworker, key: str, inode: int, job_id: str) -> list[Finding]:
    path = net.netns_path(key)
    named = net.kernel.verify_netns(path, inode)
    if named.drifted:  # nothing inside it can be read by its name
        return [named, *_verify_network(net, key, None, None)]
    ns_fd = os.open(path, os.O_RDONLY)
    try:
        with net.kernel.netlink_in(ns_fd) as nipr:
            return [named, *_verify_network(net, key, ns_fd, nipr)]
    finally:
        os.close(ns_fd)


def _verify_network(net: JobNetworker, key: str, ns_fd: int | None, nipr: IPRoute | None) -> list[Finding]:
    rec = net.records.load(key)
    assert rec is not None  # the caller holds the slot: its record stays
    job = JobNetwork.from_dict(rec.current_plan())  # the current lease and limit, not setup's
    if not job.has_network:
        return []   # NetworkType none: the namespace with lo up, nothing else
    profile = net.profiles.get(job.network_type)
    with net.kernel.host_netlink() as ipr:
        ctx = CheckCtx(key, net.names(key), rec, job, profile, ipr, nipr, ns_fd)
        # A mode no longer offered: what every networked job has is still checked (its attach step says why
        # the rest is not).
        return net.engine.check(ctx, profile.resources if profile else NETWORKED)


def report(checks: list[JobCheck | None]) -> dict:
    """The answer of larkd's `verify` op: counts, and one row per drifted object."""
    done = [c for c in checks if c is not None]
    rows = [{"job": c.job_id, "slot": c.slot, "object": f.object, "problem": f.problem,
             "fix": f"{f.fix}; {RECOVER.format(job=c.job_id)}"}
            for c in done for f in c.findings if f.drifted]
    return {"jobs": len(done), "objects": sum(len(c.findings) for c in done), "not_ready": len(checks) - len(done),
            "drift": rows}
