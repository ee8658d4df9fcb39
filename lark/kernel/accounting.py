"""Per-job traffic totals and rates from polled firewall counters (or, for modes whose frames never cross
netfilter, from the job's veth)."""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

from .firewall.base import Counters, Firewall


@dataclass
class JobUsage:
    started: float
    last: float = 0.0
    counters: Counters = field(default_factory=Counters)
    peak_in_bps: float = 0.0
    peak_out_bps: float = 0.0
    rate_in_bps: float = 0.0          # over the last poll interval: what the job moves now
    rate_out_bps: float = 0.0

    def update(self, c: Counters, now: float) -> None:
        dt = now - (self.last or self.started)
        if dt > 0.2:  # a shorter window turns a burst into a meaningless peak
            self.rate_in_bps = (c.bytes_in - self.counters.bytes_in) * 8 / dt
            self.rate_out_bps = (c.bytes_out - self.counters.bytes_out) * 8 / dt
            self.peak_in_bps = max(self.peak_in_bps, self.rate_in_bps)
            self.peak_out_bps = max(self.peak_out_bps, self.rate_out_bps)
        self.counters = c
        self.last = now

    def summary(self) -> dict:
        c = self.counters
        elapsed = max((self.last or self.started) - self.started, 1e-9)
        return {
            "bytes_in": c.bytes_in, "bytes_out": c.bytes_out,
            "packets_in": c.packets_in, "packets_out": c.packets_out,
            "avg_in_bps": c.bytes_in * 8 / elapsed if self.last else 0.0,
            "avg_out_bps": c.bytes_out * 8 / elapsed if self.last else 0.0,
            "peak_in_bps": self.peak_in_bps, "peak_out_bps": self.peak_out_bps,
            "rate_in_bps": self.rate_in_bps, "rate_out_bps": self.rate_out_bps,
            "seconds": elapsed if self.last else 0.0, "polled_at": self.last,
        }


ETH_HEADER = 14


def link_reading(stats: dict) -> Counters:
    """IP-level counters from the host end of a job's veth: its tx goes toward the job. The device counts
    Ethernet frames; 14 bytes a packet are taken off so the figures mean what netfilter counters mean."""
    return Counters(bytes_in=max(stats["tx_bytes"] - ETH_HEADER * stats["tx_packets"], 0),
                    bytes_out=max(stats["rx_bytes"] - ETH_HEADER * stats["rx_packets"], 0),
                    packets_in=stats["tx_packets"], packets_out=stats["rx_packets"])


class Accountant:
    def __init__(self, firewall: Firewall):
        self.fw = firewall
        self.jobs: dict[str, JobUsage] = {}
        self.link_ifs: dict[str, str] = {}   # key -> host veth, for jobs counted by their link
        self._lock = threading.Lock()

    def start(self, key: str, started: float | None = None, link_if: str | None = None) -> None:
        with self._lock:
            self.jobs.setdefault(key, JobUsage(started=started or time.time()))
            if link_if:
                self.link_ifs[key] = link_if

    def _link_readings(self) -> dict[str, Counters]:
        if not self.link_ifs:
            return {}
        from pyroute2 import IPRoute
        by_name = {}
        with IPRoute() as ipr:
            for link in ipr.get_links():
                stats = link.get_attr("IFLA_STATS64")
                if stats:
                    by_name[link.get_attr("IFLA_IFNAME")] = dict(stats)
        return {key: link_reading(by_name[ifname]) for key, ifname in list(self.link_ifs.items())
                if ifname in by_name}

    def poll(self) -> None:
        """One read of every counter; cheap enough to run every few seconds with hundreds of jobs."""
        readings = self.fw.read_counters()
        readings.update(self._link_readings())
        now = time.time()
        with self._lock:
            for key, usage in self.jobs.items():
                if key in readings:
                    usage.update(readings[key], now)

    def final(self, key: str, reading: Counters | None, started: float | None = None) -> dict | None:
        """Close one job's accounting with its last reading (taken by the firewall as it removes the
        counters), and stop tracking it.

        A job adopted after a daemon restart has no in-memory usage; its kernel counters kept counting, so
        the summary starts at the record's creation time.
        """
        now = time.time()
        with self._lock:
            self.link_ifs.pop(key, None)
            usage = self.jobs.pop(key, None)
            if usage is None:
                if reading is None or started is None:
                    return None
                usage = JobUsage(started=started)
            if reading is not None:
                usage.update(reading, now)
            return usage.summary()

    def summary(self, key: str) -> dict | None:
        with self._lock:
            usage = self.jobs.get(key)
            return usage.summary() if usage else None
