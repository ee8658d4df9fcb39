"""Job records: one JSON file per job, replaced atomically after every completed step.

Records live in run_dir (tmpfs) because they describe kernel objects that do not survive a reboot either;
an atomic rename is enough to survive the daemon being killed at any point. Finished-job accounting goes to
state_dir, which does persist.
"""
from __future__ import annotations

import json
import logging
import os
import stat
import threading
import time
from dataclasses import asdict, dataclass, field, fields

from ..errors import LarkError

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


def remove_stale_temps(directory: str) -> list[str]:
    """Temp files of writers that died between write and rename (`<name>.tmp.<pid>.<thread>`)."""
    removed = []
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return removed
    for name in names:
        _, sep, tail = name.partition(".tmp.")
        if not sep:
            continue
        pid = tail.split(".")[0]
        if pid.isdigit() and (int(pid) == os.getpid() or os.path.exists(f"/proc/{pid}")):
            continue  # a live writer (this daemon's own threads included) is mid-write
        try:
            os.unlink(os.path.join(directory, name))
            removed.append(name)
        except FileNotFoundError:
            pass
    return removed


def _atomic_write(path: str, data: str) -> None:
    tmp = f"{path}.tmp.{os.getpid()}.{threading.get_ident()}"
    try:
        os.unlink(tmp)  # a leftover of a writer that died with this pid and thread id
    except FileNotFoundError:
        pass
    # O_EXCL|O_NOFOLLOW: never write through a link someone planted at the temp name; 0600: records are root's.
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(data)
    os.replace(tmp, path)


def read_own(path: str) -> str:
    """A state file's text, only if it is a regular file owned by larkd's user (not a link, not planted)."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    with os.fdopen(fd) as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
            raise ValueError(f"not a regular file owned by uid {os.geteuid()}")
        return f.read()


def private_dir(path: str, mode: int = 0o700) -> str:
    """Make (or check) a state directory: owned by larkd's user, writable by no one else, `mode` enforced."""
    os.makedirs(path, mode=mode, exist_ok=True)
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
        raise LarkError("state directory is not a directory owned by larkd's user", obj=path,
                        fix=f"remove it (larkd recreates it) or chown it to uid {os.geteuid()}")
    if stat.S_IMODE(st.st_mode) != mode:
        os.chmod(path, mode)
    return path


class RecordStore:
    def __init__(self, directory: str):
        self.dir = private_dir(directory)

    def path(self, key: str) -> str:
        return os.path.join(self.dir, f"{key}.json")

    def save(self, rec: JobRecord) -> None:
        _atomic_write(self.path(rec.key), json.dumps(asdict(rec), sort_keys=True))

    def load(self, key: str) -> JobRecord | None:
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
        try:
            os.unlink(self.path(key))
        except FileNotFoundError:
            pass

    def keys(self) -> list[str]:
        try:
            names = os.listdir(self.dir)
        except FileNotFoundError:
            return []
        return sorted(n[:-5] for n in names if n.endswith(".json"))

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
        _atomic_write(os.path.join(self.dir, name), json.dumps(summary, sort_keys=True))
        self._prune()
        return name

    def _prune(self) -> None:
        names = sorted(n for n in os.listdir(self.dir) if n.endswith(".json"))
        for n in names[: max(0, len(names) - self.keep)]:
            try:
                os.unlink(os.path.join(self.dir, n))
            except FileNotFoundError:
                pass

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
