"""Who may hold how many connections to larkd at once, so that no local user can keep jobs from starting.

The socket is world-writable (any job user must reach it). Connections are counted in buckets by who opened
them, as the kernel reports it (SO_PEERCRED) and the process tree shows it:
- root: its own bucket, only the hard cap applies (the starter's hooks and admins);
- a job (a process under a root starter): one bucket per starter, so a job can only crowd out itself;
- anyone else: one bucket per uid, and all of them together may hold at most `shared` connections.
A refused client gets a "busy" answer at once; the job's wrapper retries that with backoff.
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

HARD_CAP = 1024   # whatever the buckets say: far below larkd's open-file limit


@dataclass
class Admission:
    per_uid: int = 8
    per_starter: int = 8
    shared: int = 64
    counts: dict[str, int] = field(default_factory=dict)
    total: int = 0

    def bucket(self, uid: int, starter_pid: int | None) -> str:
        if uid == 0:
            return "root"
        if starter_pid is not None:
            return f"starter:{starter_pid}"
        return f"uid:{uid}"

    def admit(self, bucket: str) -> bool:
        """Count one connection in `bucket`, or refuse it (then do not call release)."""
        if self.total >= HARD_CAP:
            return False
        n = self.counts.get(bucket, 0)
        if bucket.startswith("uid:"):
            if n >= self.per_uid or self.shared_used() >= self.shared:
                return False
        elif bucket.startswith("starter:") and n >= self.per_starter:
            return False
        self.counts[bucket] = n + 1
        self.total += 1
        return True

    def release(self, bucket: str) -> None:
        n = self.counts.get(bucket, 0) - 1
        if n > 0:
            self.counts[bucket] = n
        else:
            self.counts.pop(bucket, None)
        self.total = max(self.total - 1, 0)

    def shared_used(self) -> int:
        return sum(n for b, n in self.counts.items() if b.startswith("uid:"))


class RateLimit:
    """At most one action per key every `interval` seconds; callers reuse the last result in between."""

    def __init__(self, interval: float):
        self.interval = interval
        self.last: dict[str, tuple[float, object]] = {}
        self._lock = threading.Lock()

    def recent(self, key: str, now: float | None = None) -> object | None:
        now = time.monotonic() if now is None else now
        with self._lock:
            got = self.last.get(key)
            if got and now - got[0] < self.interval:
                return got[1]
            return None

    def remember(self, key: str, value: object, now: float | None = None) -> None:
        with self._lock:
            self.last[key] = (time.monotonic() if now is None else now, value)
            if len(self.last) > 4096:  # keys are starters; drop the oldest half rather than grow without bound
                for k, _ in sorted(self.last.items(), key=lambda kv: kv[1][0])[:2048]:
                    self.last.pop(k, None)


class LogLimit:
    """At most `per_minute` log lines per party (uid) a minute; the rest are counted and summed up in the next
    line that is let through, so a client sending garbage in a loop cannot fill the disk with larkd's log."""

    def __init__(self, per_minute: int = 20):
        self.per_minute = per_minute
        self.window: dict[object, tuple[float, int, int]] = {}   # party -> (window start, logged, suppressed)

    def allow(self, party: object, now: float | None = None) -> tuple[bool, int]:
        """(whether to log this one, how many were suppressed before it)."""
        now = time.monotonic() if now is None else now
        start, logged, suppressed = self.window.get(party, (now, 0, 0))
        if now - start >= 60:
            start, logged = now, 0
        if logged >= self.per_minute:
            self.window[party] = (start, logged, suppressed + 1)
            return False, 0
        self.window[party] = (start, logged + 1, 0)
        if len(self.window) > 4096:
            self.window.clear()
        return True, suppressed
