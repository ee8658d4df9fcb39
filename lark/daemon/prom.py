"""larkd's Prometheus metrics: setup/teardown latency, failures, and per-slot and node series read at scrape time.

Only imported when `metrics_address` is set (lark/daemon/metrics.py `make_metrics`): prometheus_client costs
larkd ~3.5 MB of RSS, and most execution points never scrape it (issue 27's larkd RSS goal).

Label cardinality stays bounded by the machine, not by the jobs it ever ran: per-slot series are labelled by
slot only; the job id, owner and accounting group appear only in `lark_job_info`, which exists while the job runs
and is gone at the next scrape after it ends (every per-job series is read from the live records at scrape time,
nothing is kept). packaging/prometheus/lark-rules.yml joins it to the per-slot series for per-owner/group figures.
"""
from __future__ import annotations

import logging
import os
from collections.abc import Iterator, Sequence
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, Counter, Histogram, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily
from prometheus_client.registry import Collector

from ..errors import LarkError
from ..kernel.accounting import Accountant
from ..kernel.ipam import LockPool
from ..plan import NETWORK_TYPES
from .records import RecordStore

log = logging.getLogger(__name__)
# Setup is ~5-50 ms without DHCP, seconds with a cold DHCP server; teardown tens of ms.
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
# Failure reasons are a fixed set, so a hostile job cannot mint label values.
REASONS = ("policy", "setup", "teardown", "refused", "internal")


class LarkdCollector(Collector):
    """Per-slot and node series, read from larkd's records, accountant and address pools at each scrape."""

    def __init__(self, records: RecordStore, acct: Accountant, pools: Sequence[LockPool]):
        self.records = records
        self.acct = acct
        self.pools = pools

    def collect(self) -> Iterator:
        recs = [r for r in self.records.all() if r.phase == "ready"]
        bytes_ = CounterMetricFamily("lark_job_bytes", "IP bytes the slot's current job moved (in = toward the job)",
                                     labels=["slot", "direction"])
        packets = CounterMetricFamily("lark_job_packets", "Packets the slot's current job moved",
                                      labels=["slot", "direction"])
        rate = GaugeMetricFamily("lark_job_rate_bps", "Rate over the last counter poll, bit/s",
                                 labels=["slot", "direction"])
        limit = GaugeMetricFamily("lark_job_limit_bps", "Configured rate limit of the slot's job, bit/s (each "
                                  "direction); absent when unlimited", labels=["slot"])
        info = InfoMetricFamily("lark_job", "The job running in a slot (present only while it runs)",
                                labels=["slot"])
        for rec in recs:
            u = self.acct.summary(rec.key) or {}
            for direction in ("in", "out"):
                bytes_.add_metric([rec.slot, direction], u.get(f"bytes_{direction}", 0))
                packets.add_metric([rec.slot, direction], u.get(f"packets_{direction}", 0))
                rate.add_metric([rec.slot, direction], u.get(f"rate_{direction}_bps", 0.0))
            if rec.rate_limit_mbit:
                limit.add_metric([rec.slot], float(rec.rate_limit_mbit) * 1e6)
            # owner and accounting_group let Prometheus sum bytes per user and group (packaging/prometheus)
            info.add_metric([rec.slot], {"job_id": rec.job_id, "global_job_id": rec.plan.get("global_job_id") or "",
                                         "network_type": rec.plan.get("network_type") or "",
                                         "owner": rec.plan.get("owner") or "",
                                         "accounting_group": rec.plan.get("accounting_group") or ""})
        yield from (bytes_, packets, rate, limit, info)
        yield GaugeMetricFamily("lark_active_jobs", "Jobs with a network right now", value=len(recs))
        free = GaugeMetricFamily("lark_pool_free", "Free entries in each address or port pool", labels=["pool"])
        size = GaugeMetricFamily("lark_pool_size", "Entries in each address or port pool", labels=["pool"])
        for pool in self.pools:
            used = sum(1 for _ in pool.entries())
            name = os.path.basename(pool.dir.rstrip("/"))
            free.add_metric([name], pool.size - used)
            size.add_metric([name], pool.size)
        yield from (free, size)


class Metrics:
    """Setup/teardown latency and failure counts (kept by larkd's hooks) plus the scrape-time collector."""

    def __init__(self, records: RecordStore, acct: Accountant, pools: Sequence[LockPool]):
        self.registry = CollectorRegistry()
        self.setup_seconds = Histogram("lark_setup_seconds", "Time to build a job's network",
                                       ["network_type"], buckets=LATENCY_BUCKETS, registry=self.registry)
        self.teardown_seconds = Histogram("lark_teardown_seconds", "Time to remove a job's network",
                                          buckets=LATENCY_BUCKETS, registry=self.registry)
        self.failures = Counter("lark_failures", "Refused or failed requests by reason", ["reason"],
                                registry=self.registry)
        for r in REASONS:
            self.failures.labels(r)   # every reason present from the start, so rate() sees the first one
        for t in NETWORK_TYPES:       # likewise the first setup of each type (the setup-time quantile rules)
            self.setup_seconds.labels(t)
        self.registry.register(LarkdCollector(records, acct, pools))
        self.server: WSGIServer | None = None

    def serve(self, address: str) -> None:
        host, _, port = address.rpartition(":")
        host = host.strip("[]")
        try:
            self.server, _thread = start_http_server(int(port), addr=host, registry=self.registry)
        except OSError as e:
            raise LarkError(f"cannot serve metrics: {e.strerror}", obj=f"metrics_address {address}",
                            fix="pick a free local port, or set metrics_address = \"\" to turn metrics off") from None
        log.info("Prometheus metrics on http://%s/metrics", address)

    def close(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()

    def failed(self, reason: str) -> None:
        self.failures.labels(reason if reason in REASONS else "internal").inc()

    def observe_setup(self, network_type: str, seconds: float) -> None:
        self.setup_seconds.labels(network_type).observe(seconds)

    def observe_teardown(self, seconds: float) -> None:
        self.teardown_seconds.observe(seconds)
