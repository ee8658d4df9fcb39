"""Job records: one JSON file per job, replaced atomically after every completed step.

Records live in run_dir (tmpfs) because they describe kernel objects that do not survive a reboot either;
an atomic rename is enough to survive the daemon being killed at any point. Finished-job accounting goes to
state_dir, which does persist.
"""
from __future__ import annotations

import contextlib
import json
import logging
import os
import time
from dataclasses import dataclass, field, fields

from ..statefiles import LiveFiles, atomic_write, private_dir, read_own

log = logging.getLogger(__name__)


@dataclass
class JobRecord:
    key: str
    slot: str
    job_id: str
    starter_pid: int
    starter_start: int                # /proc/<pid>/stat starttime, so a reused pid is not mistaken for ours
    job_pid: int
    netns_inode: int
    netns: str
    host_if: str
    plan: dict                        # JobNetwork.to_dict(): the decided plan and the addresses built for it
    phase: str = "setting-up"         # setting-up -> ready -> tearing-down (kept there when teardown failed)
    shaped: bool = False              # its limit is on the link (a fair-share job counts from then on)
    created: float = field(default_factory=time.time)


_RECORD_FIELDS = frozenset(f.name for f in fields(JobRecord))


class RecordStore(LiveFiles):
    """The records of one larkd, each read from disk once and then shared.

    Every thread that changes a job's record changes the same live object, so a save can never put back what
    another thread changed in between: a fair-share rebalance setting another job's limit while that job's own
    setup marks it ready wrote two copies before, and the later save lost the other's change.
    """

    def save(self, rec: JobRecord) -> None:
        self._store(rec.key, rec)  # a new job's record replaces the one of the job before it

    def load(self, key: str) -> JobRecord | None:
        with self._lock:
            rec = self._live.get(key)
            if rec is None:
                rec = self._read(key)
                if rec is not None:
                    self._live[key] = rec
            return rec

    def _read(self, key: str) -> JobRecord | None:
        try:
            data = json.loads(read_own(self.path(key)))
            # Fields a former version wrote and this one no longer has (steps, error, counters) are dropped,
            # so an upgrade adopts running jobs instead of treating their records as unreadable.
            return JobRecord(**{k: v for k, v in data.items() if k in _RECORD_FIELDS})
        except FileNotFoundError:
            return None
        except (ValueError, TypeError, AttributeError, OSError) as e:
            log.error("record %s is unreadable (%s); it will be treated as an orphan", self.path(key), e)
            return None

    def delete(self, key: str) -> None:
        self._forget(key)

    def all(self) -> list[JobRecord]:
        return [r for r in (self.load(k) for k in self.keys()) if r is not None]


class FinishedStore:
    """Final accounting of finished jobs, one JSON file per job, pruned to the newest `keep`."""

    def __init__(self, directory: str, keep: int = 10000):
        self.dir = directory
        self.keep = keep
        # Who moved how much, when, from which address: for root (`lark report`) only.
        private_dir(self.dir)

    def save(self, key: str, summary: dict) -> str:
        name = f"{int(summary.get('ended', time.time()) * 1000)}-{key}.json"
        atomic_write(os.path.join(self.dir, name), json.dumps(summary, sort_keys=True))
        self._prune()
        return name

    def _prune(self) -> None:
        names = sorted(n for n in os.listdir(self.dir) if n.endswith(".json"))
        for n in names[: max(0, len(names) - self.keep)]:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(self.dir, n))

    def all(self) -> list[dict]:
        out = []
        for n in sorted(os.listdir(self.dir)):
            if n.endswith(".json"):
                try:
                    out.append(json.loads(read_own(os.path.join(self.dir, n))))
                except (OSError, ValueError):
                    continue
        return out

    def latest_for_key(self, key: str) -> dict | None:
        names = sorted(n for n in os.listdir(self.dir) if n.endswith(f"-{key}.json"))
        if not names:
            return None
        try:
            return json.loads(read_own(os.path.join(self.dir, names[-1])))
        except (OSError, ValueError):
            return None
