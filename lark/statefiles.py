"""Files that must never be seen half-written: written to a temp name, then renamed over the real one.

Records, finished-job accounting, the address pools' hint and the DHCP lease cache all use `atomic_write`;
`remove_stale_temps` clears the temp files of writers that died between the write and the rename.
"""
from __future__ import annotations

import os
import threading

TEMP_MARK = ".tmp."   # <name>.tmp.<pid>.<thread>: unique per writer, and the pid says whether it still runs


def atomic_write(path: str, data: str) -> None:
    tmp = f"{path}{TEMP_MARK}{os.getpid()}.{threading.get_ident()}"
    with open(tmp, "w") as f:
        f.write(data)
    os.replace(tmp, path)


def remove_stale_temps(directory: str) -> list[str]:
    """Temp files of writers that died between write and rename."""
    removed = []
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
