"""larkd's live figures: the node totals that the startd puts in the machine ad (`lark machine-ad`, STARTD_CRON),
and its Prometheus metrics (lark/daemon/prom.py), off unless metrics_address is set.
"""
from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Protocol

from ..errors import LarkError
from ..kernel.accounting import Accountant
from ..kernel.ipam import LockPool
from .records import RecordStore


class Figures(Protocol):
    """What larkd's hooks call: NoMetrics, or prom.Metrics when metrics_address is set."""

    def serve(self, address: str) -> None: ...
    def close(self) -> None: ...
    def failed(self, reason: str) -> None: ...
    def observe_setup(self, network_type: str, seconds: float) -> None: ...
    def observe_teardown(self, seconds: float) -> None: ...


class NoMetrics:
    """What larkd's hooks call when nobody scrapes it (metrics_address unset): nothing is kept."""

    def serve(self, address: str) -> None:
        raise LarkError("metrics are off", obj=f"metrics_address {address}",
                        fix="set metrics_address before larkd starts (it is read at start only)")

    def close(self) -> None:
        pass

    def failed(self, reason: str) -> None:
        pass

    def observe_setup(self, network_type: str, seconds: float) -> None:
        pass

    def observe_teardown(self, seconds: float) -> None:
        pass


def make_metrics(address: str, records: RecordStore, acct: Accountant, pools: Sequence[LockPool]) -> Figures:
    """Prometheus metrics when `address` is set (serve() still to be called), else the no-op figures. The import
    waits until then: prometheus_client is ~3.5 MB of larkd's RSS on every EP that is not scraped."""
    if not address:
        return NoMetrics()
    from .prom import Metrics
    return Metrics(records, acct, pools)


def node_totals(records: RecordStore, acct: Accountant, machine_mbit: float | None) -> dict:
    """What the machine ad shows: sums over running jobs only, nothing that names or singles out a job."""
    recs = [r for r in records.all() if r.phase == "ready"]
    b_in = b_out = 0
    limits = 0.0
    for rec in recs:
        u = acct.summary(rec.key) or {}
        b_in += int(u.get("bytes_in", 0))
        b_out += int(u.get("bytes_out", 0))
        # Reservations only: a fair-share job's limit is what reservations leave, and it shrinks for the next
        # reservation, so it is not taken from what is available (else one unreserved job shows 0 available).
        if not rec.plan.get("fair_share_capacity_mbit"):
            limits += float(rec.rate_limit_mbit or 0.0)
    out = {"active_jobs": len(recs), "bytes_in": b_in, "bytes_out": b_out, "at": time.time()}
    if machine_mbit:
        out["avail_bandwidth_mbit"] = max(machine_mbit - limits, 0.0)
    return out


def machine_mbit(cfg) -> float | None:
    """The uplink's capacity (link speed, else bandwidth_mbit), or None when neither is known."""
    from ..kernel.linkspeed import detect
    try:
        return float(detect(cfg.uplink, cfg.bandwidth_mbit))
    except (LarkError, OSError):
        return None
