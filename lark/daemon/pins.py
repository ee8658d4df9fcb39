"""Pins: which network namespace a starter's job was first networked in, and what it moved before.

A job may be networked once, in the namespace its starter gave it. The pin is taken at the job's first setup and
lasts as long as the starter (pid and start time), whatever the job asks in between, so:
- a setup from any other namespace for the same starter is refused, even after its network was released (a
  job that makes its own namespace holds CAP_NET_ADMIN there);
- counters are monotonic per job: a network torn down while the starter still runs (root's `release`, a failed
  setup) leaves its figures in `carried`, and every later reading and the final record add them.
Pins live next to the records (run_dir): they describe processes, which do not survive a reboot either.
"""
from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass, field

from ..errors import LarkError
from ..statefiles import LiveFiles, read_own

log = logging.getLogger(__name__)

SUMMED = ("bytes_in", "bytes_out", "packets_in", "packets_out", "seconds",
          "link_bytes_in", "link_packets_in", "link_bytes_out", "link_packets_out")
PEAKS = ("peak_in_bps", "peak_out_bps")


@dataclass
class Pin:
    key: str
    starter_pid: int
    starter_start: int
    netns_inode: int
    first_setup: float = field(default_factory=time.time)
    carried: dict = field(default_factory=dict)   # usage of this job's earlier networks, already torn down
    job_id: str = ""
    global_job_id: str = ""                        # the job's GlobalJobId, once it agreed with its claim
    schedd: str = ""                               # the claim's schedd (the startd's RemoteScheddName): pushes go there

    def same_starter(self, pid: int, start: int) -> bool:
        return (self.starter_pid, self.starter_start) == (pid, start)


def merge_usage(before: dict | None, now: dict | None) -> dict | None:
    """Usage of a job across networks: counts and seconds add up, peaks take the larger, averages are
    recomputed over the total time."""
    if not before:
        return now
    if not now:
        return dict(before)
    out = dict(now)
    for k in SUMMED:
        if k in before or k in now:
            out[k] = before.get(k, 0) + now.get(k, 0)
    for k in PEAKS:
        out[k] = max(before.get(k, 0.0), now.get(k, 0.0))
    seconds = out.get("seconds") or 0.0
    out["avg_in_bps"] = out.get("bytes_in", 0) * 8 / seconds if seconds else 0.0
    out["avg_out_bps"] = out.get("bytes_out", 0) * 8 / seconds if seconds else 0.0
    if "started" in before:
        out["started"] = before["started"]
    return out


class PinStore(LiveFiles):
    """Pins on disk (they survive a larkd restart), each read from disk once and then served from memory: the
    poller asks for every running job's pin each pass, and reading 128 files a second cost more than the
    counter dump itself."""

    def load(self, key: str) -> Pin | None:
        with self._lock:
            pin = self._live.get(key)
        if pin is not None:
            return pin
        try:
            pin = Pin(**json.loads(read_own(self.path(key))))
        except FileNotFoundError:
            return None
        except (ValueError, TypeError, OSError) as e:
            # An unreadable pin must not become "no pin": that would let the job choose a new namespace.
            raise LarkError(f"pin is unreadable ({e})", obj=self.path(key),
                            fix="the slot is refused until its starter ends; then remove the file") from None
        with self._lock:
            return self._live.setdefault(key, pin)

    def save(self, pin: Pin) -> None:
        self._store(pin.key, pin)

    def drop(self, key: str) -> None:
        self._forget(key)

    def all(self) -> list[Pin]:
        out = []
        for key in self.keys():
            try:
                pin = self.load(key)
            except LarkError:
                continue
            if pin:
                out.append(pin)
        return out
