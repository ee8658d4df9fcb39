"""Helpers for end-to-end tests: run HTCondor tools as a pool user inside the testbed, submit, wait."""
from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "testbed"))
import testbed  # noqa: E402


def as_user(argv: list[str], user: str = "alice", cwd: str | None = None) -> subprocess.CompletedProcess:
    cwd = cwd or f"/home/{user}"
    return subprocess.run(testbed.in_root(["sh", "-c", 'cd "$0" && exec "$@"', cwd, *argv], user=user),
                          capture_output=True, text=True, timeout=120)


def as_root(argv: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(testbed.in_root(argv), capture_output=True, text=True, timeout=120)


def as_alice(argv: list[str], cwd: str = "/home/alice") -> subprocess.CompletedProcess:
    return as_user(argv, "alice", cwd)


def submit(name: str, body: str, user: str = "alice") -> int:
    return testbed.submit_as(user, name, body)


def history(cluster: int, attrs: list[str], timeout: float = 120, procs: int = 1) -> list:
    """The attrs of a finished cluster: one list per job when procs > 1, else one list."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        cp = as_root(["condor_history", str(cluster), "-af", *attrs])
        rows = [line.split() for line in cp.stdout.splitlines() if line.strip()]
        if len(rows) >= procs:
            return rows if procs > 1 else rows[0]
        time.sleep(2)
    raise AssertionError(f"cluster {cluster}: {procs} job(s) not in history after {timeout} s")


def queue_attrs(cluster: int, attrs: list[str]) -> list[str]:
    cp = as_root(["condor_q", str(cluster), "-af:t", *attrs])
    return cp.stdout.strip().split("\t") if cp.stdout.strip() else []


def wait_queue(cluster: int, attrs: list[str], until, timeout: float = 90) -> list[str]:
    deadline = time.time() + timeout
    row: list[str] = []
    while time.time() < deadline:
        row = queue_attrs(cluster, attrs)
        if row and until(row):
            return row
        time.sleep(1)
    raise AssertionError(f"cluster {cluster}: condition not reached in {timeout} s; last {attrs} = {row}")


def out_of(name: str, user: str = "alice", fname: str = "out.txt") -> str:
    return (testbed.ROOT / "home" / user / name / fname).read_text().strip()


SIMPLE = """executable = {exe}
arguments = "{args}"
output = out.txt
error = err.txt
log = log.txt
should_transfer_files = NO
{extra}
queue {count}
"""


def job(exe: str = "/usr/bin/python3", args: str = "", extra: str = "", count: int = 1) -> str:
    return SIMPLE.format(exe=exe, args=args, extra=extra, count=count if count > 1 else "")
