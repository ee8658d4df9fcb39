"""lark-controller's Prometheus metrics (off unless `[metrics] address` is set): registered jobs, flows, switches,
WAN group limits counted at the switch, and the registration API's requests and latency.

Labels are bounded by the site's configuration, not by jobs: per-group series are labelled by the WAN groups and
ports the config names; requests by operation and HTTP status; no series names a job (larkd's own metrics do).
"""
from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, Counter, Histogram, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from ..errors import LarkError

log = logging.getLogger(__name__)
# A registration waits for every switch's barrier: ~1-10 ms on a local switch, up to barrier_timeout (2 s).
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
# The API's operations by HTTP method; anything else is "other", so a client cannot mint label values.
OPERATIONS = {"POST": "register", "DELETE": "unregister", "PUT": "sync", "GET": "status"}


class ControllerCollector(Collector):
    """Series read at each scrape from the controller's own status (the same figures `lark-controller status`
    prints), so nothing is kept twice."""

    def __init__(self, status: Callable[[], dict]):
        self.status = status

    def collect(self) -> Iterator:
        st = self.status()
        t = st["totals"]
        yield GaugeMetricFamily("lark_controller_jobs", "Jobs registered with the controller", value=t["jobs"])
        yield GaugeMetricFamily("lark_controller_eps", "Execution points with registered jobs", value=len(t["eps"]))
        yield GaugeMetricFamily("lark_controller_job_flows", "Flows of registered jobs on each switch",
                                value=t["job_flows"])
        switches = GaugeMetricFamily("lark_controller_switches", "OpenFlow switches connected to the controller; "
                                     "ready: base and job flows installed", labels=["state"])
        switches.add_metric(["connected"], sum(1 for s in st["switches"] if s["connected"]))
        switches.add_metric(["ready"], sum(1 for s in st["switches"] if s["ready"]))
        yield switches
        wan_bytes = CounterMetricFamily("lark_controller_wan_group_bytes", "Bytes a WAN group's jobs sent to the "
                                        "WAN, counted at the switch by the group's meter or queue",
                                        labels=["group", "port"])
        wan_limit = GaugeMetricFamily("lark_controller_wan_group_limit_bps", "A WAN group's limit on a WAN port, "
                                      "bit/s", labels=["group", "port"])
        wan_jobs = GaugeMetricFamily("lark_controller_wan_group_jobs", "Registered jobs in a WAN group on a WAN port",
                                     labels=["group", "port"])
        for g in st["wan_groups"]:
            for p in g["ports"]:
                wan_bytes.add_metric([g["group"], p["port"]], p["bytes"])
                wan_limit.add_metric([g["group"], p["port"]], p["rate_mbit"] * 1e6)
                wan_jobs.add_metric([g["group"], p["port"]], p["jobs"])
        yield from (wan_bytes, wan_limit, wan_jobs)


class ControllerMetrics:
    """The API's request counts and latencies plus the scrape-time collector, in a registry of their own."""

    def __init__(self, status: Callable[[], dict]):
        self.registry = CollectorRegistry()
        self.requests = Counter("lark_controller_requests", "Registration API requests by operation and HTTP "
                                "status", ["operation", "code"], registry=self.registry)
        self.request_seconds = Histogram("lark_controller_request_seconds", "Time to answer an API request "
                                         "(a registration includes every switch's barrier)", ["operation"],
                                         buckets=LATENCY_BUCKETS, registry=self.registry)
        for op in OPERATIONS.values():   # present from the start, so rate() sees the first request
            self.requests.labels(op, "200")
            self.request_seconds.labels(op)
        self.registry.register(ControllerCollector(status))
        self.server: WSGIServer | None = None

    def observe(self, method: str, code: int, seconds: float) -> None:
        op = OPERATIONS.get(method, "other")
        self.requests.labels(op, str(code)).inc()
        self.request_seconds.labels(op).observe(seconds)

    def serve(self, address: str) -> None:
        host, _, port = address.rpartition(":")
        try:
            self.server, _thread = start_http_server(int(port), addr=host.strip("[]"), registry=self.registry)
        except OSError as e:
            raise LarkError(f"cannot serve metrics: {e.strerror}", obj=f"controller [metrics] address {address}",
                            fix="pick a free local port, or remove [metrics] to turn metrics off") from None
        log.info("Prometheus metrics on http://%s/metrics", address)
