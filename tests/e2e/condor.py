"""Helpers for end-to-end tests: run HTCondor tools as a pool user inside the testbed, submit, wait."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "testbed"))
import testbed  # noqa: E402

_config = os.environ.get("CONDOR_CONFIG")
from htcondor2 import JobEventLog, JobEventType  # noqa: E402
# Finding no HTCondor on this host, the bindings set CONDOR_CONFIG=/dev/null for the whole process; the HTCondor
# tools the tests run in the pool's root (some without `env -i`) would then read no configuration at all.
if _config is None:
    os.environ.pop("CONDOR_CONFIG", None)


def as_user(argv: list[str], user: str = "alice", cwd: str | None = None) -> subprocess.CompletedProcess:
    cwd = cwd or f"/home/{user}"
    return subprocess.run(testbed.in_root(["sh", "-c", 'cd "$0" && exec "$@"', cwd, *argv], user=user),
                          capture_output=True, text=True, timeout=120)


def as_root(argv: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(testbed.in_root(argv), capture_output=True, text=True, timeout=120)


def as_alice(argv: list[str], cwd: str = "/home/alice") -> subprocess.CompletedProcess:
    return as_user(argv, "alice", cwd)


SUBMITTED: dict[int, Path] = {}  # cluster -> its submit directory (where its event log is)
# Events that mean a start the test did not ask for: the job was evicted, lost its starter or shadow.
UNASKED = {JobEventType.JOB_EVICTED: "evicted", JobEventType.SHADOW_EXCEPTION: "shadow exception",
           JobEventType.JOB_RECONNECT_FAILED: "reconnect failed", JobEventType.JOB_DISCONNECTED: "disconnected"}


def submit(name: str, body: str, user: str = "alice") -> int:
    cluster = testbed.submit_as(user, name, body)
    SUBMITTED[cluster] = testbed.ROOT / "home" / user / name
    return cluster


def submit_script(name: str, script: str, extra: str = "", user: str = "alice") -> int:
    """A Python job whose program is `script`, sent to the execution point as job.py by file transfer."""
    d = testbed.ROOT / "home" / user / name
    d.mkdir(parents=True, exist_ok=True)
    (d / "job.py").write_text(script)
    return submit(name, job(args="job.py", inputs=("job.py",), extra=extra), user=user)


def starts(cluster: int, log: str = "log.txt") -> dict[int, list[str]]:
    """Each job of the cluster: what its event log says happened to it, in order ("execute", "evicted", ...),
    read with HTCondor's own event log reader."""
    seen: dict[int, list[str]] = {}
    for event in JobEventLog(str(SUBMITTED[cluster] / log)).events(stop_after=0):
        if event.cluster != cluster:
            continue
        if event.type == JobEventType.EXECUTE:
            seen.setdefault(event.proc, []).append("execute")
        elif event.type in UNASKED:
            seen.setdefault(event.proc, []).append(UNASKED[event.type])
    return seen


def assert_ran_once(cluster: int, procs: int = 1) -> None:
    """Every job of the cluster started exactly once: an eviction its exit code hides fails the test."""
    seen = starts(cluster)
    bad = {proc: events for proc, events in seen.items() if events != ["execute"]}
    assert not bad and len(seen) == procs, (
        f"cluster {cluster}: each job must start once and never be evicted; its event log shows {seen}")


def history(cluster: int, attrs: list[str], timeout: float = 120, procs: int = 1, once: bool = True) -> list:
    """The attrs of a finished cluster: one list per job when procs > 1, else one list. `once`: each job's event
    log must show exactly one start and no eviction (a test that causes restarts passes False)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        cp = as_root(["condor_history", str(cluster), "-af", *attrs])
        rows = [line.split() for line in cp.stdout.splitlines() if line.strip()]
        if len(rows) >= procs:
            if once and cluster in SUBMITTED:
                assert_ran_once(cluster, procs)
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


# Jobs are shaped like a pool without a shared filesystem: file transfer (the programs are the EP's own, not
# sent); the job's stdout and stderr and any file it writes come back at its end.
SIMPLE = """executable = {exe}
transfer_executable = false
arguments = "{args}"
output = out.txt
error = err.txt
log = log.txt
should_transfer_files = YES
when_to_transfer_output = ON_EXIT
{inputs}{extra}
queue {count}
"""


def job(exe: str = "/usr/bin/python3", args: str = "", extra: str = "", count: int = 1,
        inputs: tuple[str, ...] = ()) -> str:
    """A submit file; `inputs`: files (or URLs) the job needs from the submit directory, sent by file transfer."""
    lines = f"transfer_input_files = {', '.join(inputs)}\n" if inputs else ""
    return SIMPLE.format(exe=exe, args=args, extra=extra, count=count if count > 1 else "", inputs=lines)


def assert_goodput_and_count(what: str, size: int, mbit: int, seconds: float, figure: str, counted: str) -> float:
    """A transfer of `size` bytes in `seconds` at a `mbit` Mbit/s limit: print its goodput ratio and the history's
    `figure` (`counted`), assert the count within 1% (headers: bytes on the wire) and the ratio loosely (0.5-1.02:
    it cannot beat its limit; a loaded machine is slower). Returns the ratio."""
    ratio = size * 8 / seconds / (mbit * 1e6)
    print(f"{what}: {size} bytes in {seconds:.2f} s, goodput {ratio:.3f} of {mbit} Mbit/s; history {figure} "
          f"{counted} ({int(counted) / size:.4f} of the bytes)")
    assert size <= int(counted) <= size * 1.01, f"{what}: {figure} = {counted} for {size} bytes (1% allowed)"
    assert 0.5 <= ratio <= 1.02, f"{what}: goodput {ratio:.3f} of the {mbit} Mbit/s limit"
    return ratio


def wait_larkd_back(cluster: int, timeout: float = 40) -> float:
    """After a kill -9 of larkd: when `lark status` answered again (condor_master restarts larkd), asserting that
    the new larkd adopted the running job `cluster`.0 (phase ready)."""
    deadline = time.time() + timeout
    while (st := as_root(["lark", "status", "--json"])).returncode != 0:
        assert time.time() < deadline, f"larkd did not come back within {timeout} s of its kill -9"
        time.sleep(0.5)
    back_at = time.time()
    phases = [j["phase"] for j in json.loads(st.stdout) if j["job_id"] == f"{cluster}.0"]
    assert phases == ["ready"], f"job {cluster}.0 not adopted by the restarted larkd: {st.stdout}"
    return back_at
