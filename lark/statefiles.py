"""larkd's state files: never seen half-written, never written or read through a planted link.

Records, pins, finished-job accounting, the address pools' hint and the DHCP lease cache all use `atomic_write`
(a temp name, then a rename over the real one); `remove_stale_temps` clears the temp files of writers that died
between the write and the rename; `read_own` and `private_dir` refuse files and directories larkd's user does
not own. `LiveFiles` is the shape records and pins share: one JSON file per key, served from memory.
"""
from __future__ import annotations

import contextlib
import json
import os
import stat
import threading
from dataclasses import asdict

from .errors import LarkError

TEMP_MARK = ".tmp."   # <name>.tmp.<pid>.<thread>: unique per writer, and the pid says whether it still runs


# How larkd's state files are encoded: one encoder for all (json.dumps with options builds a new one per call).
# sort_keys: the same object always gives the same text (records compare it); default: dataclasses as dicts.
STATE_JSON = json.JSONEncoder(sort_keys=True, default=asdict)

# No fsync, of the file or its directory (there never was one). Records and pins live in run_dir, a tmpfs whose
# contents, like the kernel objects they describe, do not survive a host crash: nothing to make durable. The finished
# records (state_dir, on disk) are the exception: a host crash within the kernel's writeback delay of a job's end
# can lose that job's record, while its figures are already in the job's ad and history (the exit barrier). Either
# way the rename keeps a reader (and a restart after larkd is killed) from ever seeing a half-written file.
_TEMP_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


def atomic_write(path: str, data: str) -> None:
    tmp = f"{path}{TEMP_MARK}{os.getpid()}.{threading.get_ident()}"
    # O_EXCL|O_NOFOLLOW: never write through a link someone planted at the temp name; 0600: state is root's.
    try:
        fd = os.open(tmp, _TEMP_FLAGS, 0o600)
    except FileExistsError:
        # A leftover of a writer that died with this pid and thread id (or a planted name): removed, then made
        # anew with the same flags. Unlinked only when it is there, so a write costs no unlink in the usual case.
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        fd = os.open(tmp, _TEMP_FLAGS, 0o600)
    try:
        view = memoryview(data.encode())
        while view:
            view = view[os.write(fd, view):]
    finally:
        os.close(fd)
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


def remove_stale_temps(directory: str) -> list[str]:
    """Temp files of writers that died between write and rename."""
    removed: list[str] = []
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return removed
    for name in names:
        _, sep, tail = name.partition(TEMP_MARK)
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


class LiveFiles:
    """One JSON file per key (a dataclass each) in a private directory, each read from disk once and then shared
    from memory: larkd is the only writer, so memory and disk cannot disagree. How a file is read (and what an
    unreadable one means) is the subclass's; writes and removals are here, under one lock held from serialising
    to the rename, so an older snapshot never lands after a newer one."""

    def __init__(self, directory: str):
        self.dir = private_dir(directory)
        self._live: dict = {}
        self._lock = threading.Lock()
        self._written: dict[str, str] = {}  # key -> `_crash_view` of what its file holds (when it had one)

    def path(self, key: str) -> str:
        return os.path.join(self.dir, f"{key}.json")

    def _crash_view(self, obj) -> str | None:
        """What of `obj` a restart after a crash needs from its file, as text: a save whose view equals that of the
        file's last write changes memory only (the file already holds all a crash needs). None: every save writes.
        """
        return None

    def _store(self, key: str, obj) -> bool:
        """Keep `obj` as the key's live object and write it, unless `_crash_view` says the file already holds what
        a crash needs of it; True when written."""
        with self._lock:
            self._live[key] = obj  # replaces the object of the key's previous job, if any
            view = self._crash_view(obj)
            if view is not None and self._written.get(key) == view:
                return False
            # vars, not asdict: the same text for these flat dataclasses without asdict's deep copy (0.06 ms a save)
            atomic_write(self.path(key), STATE_JSON.encode(vars(obj)))
            if view is None:
                self._written.pop(key, None)
            else:
                self._written[key] = view
            return True

    def _forget(self, key: str) -> None:
        with self._lock:
            self._live.pop(key, None)
            self._written.pop(key, None)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path(key))

    def keys(self) -> list[str]:
        try:
            names = os.listdir(self.dir)
        except FileNotFoundError:
            return []
        return sorted(n[:-5] for n in names if n.endswith(".json"))
