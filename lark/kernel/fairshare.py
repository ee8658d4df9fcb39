"""Fair shares for jobs without a bandwidth reservation (default_bandwidth = "fair").

A job whose slot was allocated no Bandwidth would otherwise run unlimited and could starve the jobs that reserved
bandwidth. Instead every such job gets an equal share of what the running reserved jobs leave of the link:

    share = max((capacity - sum of reservations) / number of unreserved jobs, floor)

so the sum of all limits on the link never exceeds its capacity (unless reservations leave less than `floor` per
unreserved job). The shares move whenever a job starts or ends; a starting job's neighbours are lowered before
its own limit goes in, so a reserved job never shares the link with more than it leaves.
"""
from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from pyroute2 import IPRoute

from ..errors import LarkError
from . import links, netns, shaping

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LinkJob:
    """One running job on the link, as far as its limit goes."""
    key: str
    job_id: str
    reserved_mbit: float | None       # the slot's allocation; None for a fair-share job
    capacity_mbit: float | None       # fair-share jobs: the link capacity their plan saw
    current_mbit: float | None        # the limit the job has now (fair-share jobs)
    host_if: str = ""
    job_if: str = ""
    netns_path: str = ""

    @property
    def fair(self) -> bool:
        return self.capacity_mbit is not None


def link_jobs(records: Iterable[Any], new: Any, job_if_of: Callable[[str], str],
              netns_path_of: Callable[[str], str]) -> list[LinkJob]:
    """The jobs on the link from larkd's records (key, job_id, phase, shaped, host_if, plan dict, the current
    rate_limit_mbit: a fair-share job's as last rebalanced, a reserved job's as planned) and `new`, the
    plan of a job being set up. A fair-share job still being set up is left out: it sets its own share when it
    gets there; a reserved one counts from the start (the safe side)."""
    running = []
    for r in records:
        p = r.plan
        if r.phase == "tearing-down" or (new is not None and r.key == new.key) \
                or p.get("network_type", "none") == "none":
            continue
        capacity = p.get("fair_share_capacity_mbit")
        if capacity and not r.shaped:
            continue
        running.append(LinkJob(r.key, r.job_id, None if capacity else p.get("rate_limit_mbit"), capacity,
                               r.rate_limit_mbit, r.host_if, job_if_of(r.key), netns_path_of(r.key)))
    if new is not None and new.has_network:
        capacity = new.fair_share_capacity_mbit
        running.append(LinkJob(new.key, new.job_id, None if capacity else new.rate_limit_mbit, capacity, None))
    return running


def share_mbit(capacity: float, reserved: Iterable[float], unreserved: int, floor: float) -> float:
    """Each unreserved job's limit: an equal split of what the reservations leave, never below `floor`."""
    if unreserved < 1:
        raise ValueError("no unreserved job to share among")
    left = capacity - sum(reserved)
    return max(left / unreserved, floor)


def shares(jobs: list[LinkJob], floor: float) -> dict[str, float]:
    """The limit every fair-share job on the link should have now (key -> Mbit/s)."""
    fair = [j for j in jobs if j.fair]
    if not fair:
        return {}
    # All plans on one machine read the same inventory; the smallest figure is the safe one if it changed.
    capacity = min(j.capacity_mbit for j in fair if j.capacity_mbit is not None)
    reserved = [j.reserved_mbit for j in jobs if not j.fair and j.reserved_mbit]
    rate = share_mbit(capacity, reserved, len(fair), floor)
    return {j.key: rate for j in fair}


class FairShare:
    """Serialises every change of the set of limits on the link (larkd sets up several jobs at once)."""

    def __init__(self, floor_mbit: float):
        self.floor = floor_mbit
        self.lock = threading.Lock()

    def rebalance(self, ipr: IPRoute, running: list[LinkJob], skip: str | None = None) -> dict[str, float]:
        """Give every running fair-share job its share; returns the rates that changed (key -> Mbit/s).

        Call with `self.lock` held, with the set of jobs that will be on the link once the caller's change is
        done; `skip` is the job being set up (counted, but its limit goes in with its qdiscs). A job that fails to
        change (e.g. it is going away) is logged and skipped: its neighbours still get their new rates."""
        changed: dict[str, float] = {}
        target = shares(running, self.floor)
        # Lower first, then raise: at no moment does the sum exceed what it was or what it will be.
        order = sorted((j for j in running if j.key in target and j.key != skip and j.current_mbit != target[j.key]),
                       key=lambda j: target[j.key] - (j.current_mbit or float("inf")))
        for j in order:
            try:
                self._change(ipr, j, target[j.key])
            except (LarkError, OSError) as e:
                log.warning("fair share: could not move job %s to %g Mbit/s: %s", j.job_id, target[j.key], e)
                continue
            changed[j.key] = target[j.key]
        if changed:
            log.info("fair share: %d unreserved job(s) now at %g Mbit/s each",
                     len(target), next(iter(target.values())))
        return changed

    @staticmethod
    def _change(ipr: IPRoute, job: LinkJob, mbit: float) -> None:
        limit = shaping.limit_for(mbit, job.job_id)
        host_idx = links.index_by_name(ipr, job.host_if)
        if host_idx is None:
            raise LarkError("its host-side device is gone", job=job.job_id, obj=job.host_if,
                            fix="none needed: the job is ending")
        fd = os.open(job.netns_path, os.O_RDONLY)
        try:
            with netns.netlink_in(fd) as nipr:
                job_idx = links.index_by_name(nipr, job.job_if)
                if job_idx is None:
                    raise LarkError("its device is gone", job=job.job_id, obj=job.job_if,
                                    fix="none needed: the job is ending")
                shaping.change(ipr, host_idx, nipr, job_idx, limit, job.job_id)
        finally:
            os.close(fd)
