"""`lark status --verify`, CNI's CHECK: each ready job's kernel objects against its record, read-only.

The checks themselves are the `verify*` functions next to the code that makes each object (netns, links, shaping,
the attach mode, the job netns filter, the firewall driver), so what is checked follows what setup builds; this
module walks one job through them in setup's order and turns what they found into rows for the admin.
"""
from __future__ import annotations

import logging
import os
from dataclasses import dataclass

from pyroute2 import IPRoute

from ..kernel import links, netns, scitags, shaping
from ..kernel.drift import Finding, drifted
from ..kernel.firewall import job_netns
from ..names import JobNames
from ..plan import JobNetwork
from .jobnet import JobNetworker

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
    named = netns.verify_named(path, inode)
    if named.drifted:  # nothing inside it can be read by its name
        return [named, *_verify_network(net, key, None, None)]
    ns_fd = os.open(path, os.O_RDONLY)
    try:
        with netns.netlink_in(ns_fd) as nipr:
            return [named, *_verify_network(net, key, ns_fd, nipr)]
    finally:
        os.close(ns_fd)


def _verify_network(net: JobNetworker, key: str, ns_fd: int | None, nipr: IPRoute | None) -> list[Finding]:
    rec = net.records.load(key)
    assert rec is not None  # the caller holds the slot: its record stays
    job = JobNetwork.from_dict(rec.plan)
    if not job.has_network:
        return []   # NetworkType none: the namespace with lo up, nothing else
    n: JobNames = net.names(key)
    mode = net.modes.get(job.network_type)
    with IPRoute() as ipr:
        found, host_idx, job_idx = links.verify_veth(ipr, n.host_if, nipr, n.job_if)
        if nipr is not None and job_idx is not None:
            for address, prefix, gateway in ((job.ipv4, job.ipv4_prefix, job.gateway4),
                                             (job.ipv6, job.ipv6_prefix, job.gateway6)):
                if address:
                    found += links.verify_job_address(nipr, job_idx, n.job_if, address, prefix, gateway)
        with net.fair.lock:   # a fair-share rebalance moves limits and records together
            mbit = rec.plan.get("rate_limit_mbit")
            if mbit:
                found += shaping.verify(ipr, host_idx, n.host_if, nipr, job_idx, n.job_if,
                                        shaping.limit_for(mbit, rec.job_id))
        if mode is None:
            found.append(drifted(f"network type {job.network_type}", "this larkd's configuration no longer offers it",
                                 "the configuration changed under a running job; nothing else was checked for it"))
        elif host_idx is not None:
            found += mode.verify(ipr, host_idx, job, n)
    if ns_fd is not None and mode is not None:
        found += job_netns.verify(ns_fd, block_inbound=not job.inbound, dhcpv6_client=net._dhcpv6(job.plan, mode))
        if job.plan.scitag:
            found += scitags.verify(ns_fd, job.plan.scitag, fireflies=bool(net.cfg.scitags_collector))
    found += net.fw.verify_job(job, n)
    return found


def report(checks: list[JobCheck | None]) -> dict:
    """The answer of larkd's `verify` op: counts, and one row per drifted object."""
    done = [c for c in checks if c is not None]
    rows = [{"job": c.job_id, "slot": c.slot, "object": f.object, "problem": f.problem,
             "fix": f"{f.fix}; {RECOVER.format(job=c.job_id)}"}
            for c in done for f in c.findings if f.drifted]
    return {"jobs": len(done), "objects": sum(len(c.findings) for c in done), "not_ready": len(checks) - len(done),
            "drift": rows}
