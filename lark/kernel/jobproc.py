"""Daemons larkd starts inside a job's netns (dhcpcd for DHCPv6, a dnsmasq relay for IPv6 loopback resolvers):
finding them again by pid file, and stopping them before the namespace goes.

A pid file alone is not proof (pids are reused, and these daemons may rewrite their command lines): a pid counts
only when its process has the expected name and sits in the job's netns, whose inode is recorded at start.
"""
from __future__ import annotations

import logging
import os
import shutil
import signal
import time
from pathlib import Path

log = logging.getLogger(__name__)


def record_netns(directory: str, netns_path: str) -> int:
    """Remember which netns the daemon in `directory` belongs to (before starting it)."""
    inode = os.stat(netns_path).st_ino
    with open(os.path.join(directory, "netns_inode"), "w") as f:
        f.write(str(inode))
    return inode


def find(directory: str, pid_files: list[str], comm: str) -> int | None:
    """The running daemon named `comm` whose pid is in one of `pid_files` and which sits in the recorded netns."""
    try:
        want = int(Path(directory, "netns_inode").read_text())
    except (OSError, ValueError):
        return None
    for path in pid_files:
        try:
            pid = int(Path(path).read_text().strip())
            if Path(f"/proc/{pid}/comm").read_text().strip() == comm and os.stat(f"/proc/{pid}/ns/net").st_ino == want \
                    and alive(pid):
                return pid
        except (OSError, ValueError):
            continue
    return None


def stop_and_remove(pid: int | None, directory: str, what: str) -> bool:
    """Stop the daemon found in `directory` (pid None: none runs) and remove the directory; safe to repeat.
    True when one was running."""
    if pid is not None:
        stop(pid, what)
    shutil.rmtree(directory, ignore_errors=True)
    return pid is not None


def directories(parent: str) -> list[str]:
    """The per-job directories under `parent` (for gc); none when it does not exist yet."""
    try:
        return os.listdir(parent)
    except OSError:
        return []


def stop(pid: int, what: str, grace: float = 3.0) -> None:
    """SIGTERM, then SIGKILL after `grace` seconds."""
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.02)
    if alive(pid):
        log.warning("%s (pid %d) ignored SIGTERM; killing it", what, pid)
        os.kill(pid, signal.SIGKILL)


def alive(pid: int) -> bool:
    try:
        # A zombie has ended: its state is Z (it waits for a parent that is not larkd to reap it).
        return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False
