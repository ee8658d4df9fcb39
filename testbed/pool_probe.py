"""Reachability probes through real HTCondor jobs on the pool testbed (testbed/pool.py).

Each probe job (one per user and EP asked for) listens on pool.JOB_PORT, reports its own address in its working
directory, waits for the driver to hand it its peers' addresses, then tries each peer and the WAN server's /link
page from inside its own network namespace, and writes what it could and could not reach. The jobs are submitted
with file transfer (probe.py is sent, python3 is the EP's): the working directory is the job's scratch directory on
its EP, where the driver reads and writes (pool.job_scratch), and the files come back to /home/<user>/<dir> when
the job ends. Every job must start exactly once: its event log is read after it left the queue (start_problems;
the demo and tests/e2e_pool fail on a restart or an eviction). Used by `make demo-pool` and tests/e2e_pool.
Standard library only.
"""
from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import eventlog
import pool

log = logging.getLogger("pool.probe")

# Runs as the job, in its network namespace: argv label port wan_server gateway.
PROGRAM = r'''
import json, os, socket, sys, threading, time, urllib.request
label, port, wan, gateway = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]

def put(name, data):
    with open(name + ".tmp", "w") as f:
        json.dump(data, f)
    os.rename(name + ".tmp", name)

def wait_for(name, timeout=240):
    deadline = time.time() + timeout
    while not os.path.exists(name):
        if time.time() > deadline:
            sys.exit("no " + name + " after %d s" % timeout)
        time.sleep(0.2)
    with open(name) as f:
        return json.load(f)

srv = socket.create_server(("0.0.0.0", port))
def serve():
    while True:
        c, _ = srv.accept()
        c.sendall(label.encode())
        c.close()
threading.Thread(target=serve, daemon=True).start()
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
u.connect((gateway, 9))  # no packet: only picks the source address
put("me.json", {"label": label, "address": u.getsockname()[0]})

targets = wait_for("targets.json")
seen = {}
for peer, addr in targets["peers"].items():
    try:
        with socket.create_connection((addr, port), timeout=3) as c:
            c.settimeout(3)
            got = c.recv(200).decode()
        seen[peer] = "reached" if got == peer else "reached " + got
    except OSError as e:
        seen[peer] = "blocked (%s)" % (e.strerror or type(e).__name__)
try:
    with urllib.request.urlopen("http://%s:%d/link" % (wan, targets["wan_port"]), timeout=4) as r:
        seen["wan"] = r.read().decode().strip()
except OSError as e:
    seen["wan"] = "blocked (%s)" % (getattr(e, "reason", None) or e)
put("results.json", seen)
print(json.dumps(seen))
wait_for("done")
'''


@dataclass
class ProbeJob:
    user: str
    ep: str
    extra: str = ""                     # more submit-file lines, e.g. accounting_group = ...
    n: int = 1                          # the user's n-th job on this EP (two jobs of one owner on one EP)
    cluster: int = 0
    address: str = ""
    seen: dict = field(default_factory=dict)
    starts: list[str] | None = None     # its event log once it left the queue ("execute", "evicted", ...)

    @property
    def label(self) -> str:
        return f"{self.user}{self.n if self.n > 1 else ''}@{self.ep}"

    def dir(self, run: str) -> str:
        return f"{run}-{self.user}{self.n if self.n > 1 else ''}-{self.ep}"

    def path(self, run: str) -> Path:
        """The submit directory (on the CM; the job's files come back here when it ends)."""
        return pool.HOME / self.user / self.dir(run)

    def scratch(self, run: str) -> Path | None:
        """The running job's working directory on its EP (None while it has not started or after it ended)."""
        return pool.job_scratch(self.path(run) / "log.txt", f"{self.cluster}.0")


def policy_jobs() -> list[ProbeJob]:
    """The jobs that show pool.SDN_POLICIES: two owners on both EPs, a students job, a dropped owner, and a second
    job of alice on ep1 (the same owner on one EP: through the core switch and back)."""
    return [ProbeJob("alice", "ep1"), ProbeJob("alice", "ep1", n=2), ProbeJob("bob", "ep1"),
            ProbeJob("alice", "ep2", "accounting_group = students"), ProbeJob("bob", "ep2"),
            ProbeJob("carol", "ep2")]


def submit_file(job: ProbeJob) -> str:
    return (f'executable = /usr/bin/python3\ntransfer_executable = false\n'
            f'arguments = "probe.py {job.label} {pool.JOB_PORT} {pool.WAN_SERVER} {pool.GATEWAY}"\n'
            "output = out.txt\nerror = err.txt\nlog = log.txt\n"
            "should_transfer_files = YES\nwhen_to_transfer_output = ON_EXIT\ntransfer_input_files = probe.py\n"
            f'requirements = TARGET.LarkPoolEP == "{job.ep}"\n'
            "+InboundConnectivity = true\n"
            f"{job.extra}\nqueue\n")


def _read(j: ProbeJob, run: str, name: str) -> dict | None:
    """A file the running job wrote in its working directory, None while it is not there."""
    d = j.scratch(run)
    try:
        return json.loads((d / name).read_text()) if d is not None else None
    except FileNotFoundError:
        return None


def _wait_files(jobs: list[ProbeJob], run: str, name: str, timeout: float) -> dict[str, dict]:
    """Label -> the file `name` of each job's working directory, once every job wrote it."""
    deadline = time.time() + timeout
    got: dict[str, dict] = {}
    while True:
        for j in jobs:
            if j.label not in got and (data := _read(j, run, name)) is not None:
                got[j.label] = data
        missing = [j for j in jobs if j.label not in got]
        if not missing:
            return got
        if time.time() > deadline:
            raise RuntimeError(f"probe jobs {', '.join(f'{j.cluster} ({j.label})' for j in missing)} wrote no "
                               f"{name} in {timeout:.0f} s: {_why(missing, run)}")
        time.sleep(0.5)


def _why(jobs: list[ProbeJob], run: str) -> str:
    cp = pool.run(pool.in_machine("cm", ["condor_q", *(str(j.cluster) for j in jobs), "-af:t", "ClusterId",
                                         "JobStatus", "HoldReason"]), check=False)
    queue = cp.stdout.strip().replace("\n", "; ") or "not in the queue"
    starts = []
    for j in jobs:
        events = eventlog.starts(j.path(run) / "log.txt").get(f"{j.cluster}.0", [])
        starts.append(f"{j.label}: {', '.join(events) or 'no start'}")
    return f"{queue} (event logs: {'; '.join(starts)})"


def run_probes(jobs: list[ProbeJob], run: str = "probe", timeout: float = 180,
               while_running: Callable[[], None] | None = None,
               before_probing: Callable[[], None] | None = None) -> list[ProbeJob]:
    """Submit one probe job per entry, let every job try every other one and the WAN, collect the answers and,
    once the jobs have left the queue, what each one's event log shows (ProbeJob.starts; see start_problems).

    `before_probing` is called once every job runs networked and before any probes; `while_running` once all
    answers are in and before the jobs are let go (their networks still exist)."""
    for j in jobs:
        j.cluster = pool.submit_as(j.user, j.dir(run), submit_file(j), files={"probe.py": PROGRAM})
        log.info("%s: job %d.0", j.label, j.cluster)
    try:
        me = _wait_files(jobs, run, "me.json", timeout)
        for j in jobs:
            j.address = me[j.label]["address"]
        if before_probing:
            before_probing()
        for j in jobs:
            peers = {o.label: o.address for o in jobs if o is not j}
            _put(_running(j, run) / "targets.json", {"peers": peers, "wan_port": pool.WAN_HTTP_PORT})
        results = _wait_files(jobs, run, "results.json", 60)
        for j in jobs:
            j.seen = results[j.label]
        if while_running:
            while_running()
    finally:
        for j in jobs:
            if (d := j.scratch(run)) is not None:
                _put(d / "done", {})
    wait_gone([j.cluster for j in jobs])
    # Every job has left the queue: its event log is complete.
    for j in jobs:
        j.starts = eventlog.starts(j.path(run) / "log.txt").get(f"{j.cluster}.0", [])
        if j.starts != ["execute"]:
            log.error("%s: %s", j.label, eventlog.describe(f"{j.cluster}.0", j.starts))
    return jobs


def _running(j: ProbeJob, run: str) -> Path:
    d = j.scratch(run)
    if d is None:
        raise RuntimeError(f"probe job {j.cluster} ({j.label}) is no longer running: {_why([j], run)}")
    return d


def _put(path: Path, data: dict) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data))
    tmp.chmod(0o644)
    tmp.rename(path)


def wait_gone(clusters: list[int], timeout: float = 60) -> None:
    """Until the clusters have left the queue (their slots and job networks are released)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        cp = pool.run(pool.in_machine("cm", ["condor_q", *map(str, clusters), "-af", "ClusterId"]), check=False)
        if cp.returncode == 0 and not cp.stdout.strip():
            return
        time.sleep(1)
    pool.run(pool.in_machine("cm", ["condor_rm", *map(str, clusters)]), check=False)
    log.warning("jobs %s still queued after %.0f s; removed", clusters, timeout)


def table(jobs: list[ProbeJob]) -> str:
    """One row per job: what it reached (peers by user@ep, * where both are on one EP; the WAN link its request
    came in on)."""
    heads = ["job", "owner", "address", *[o.label for o in jobs], "WAN"]
    rows = [heads]
    for j in jobs:
        cells = [f"{j.cluster}.0", j.label, j.address]
        for o in jobs:
            same_ep = "*" if o.ep == j.ep else ""
            cells.append("-" if o is j else _short(j.seen.get(o.label, "?")) + same_ep)
        wan = j.seen.get("wan", "?")
        cells.append(f"via {wan}" if wan in ("wan0", "wan1") else _short(wan))
        rows.append(cells)
    widths = [max(len(r[i]) for r in rows) for i in range(len(heads))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def expected(src: ProbeJob, dst: str) -> str:
    """What pool.SDN_POLICIES let `src` see of peer `dst` (a label) or of "wan": "reached" or "blocked" for a peer,
    "wan0", "wan1" or "blocked" for the WAN. carol is dropped both ways; peers of another owner are sliced off;
    the students group has no WAN; bob's WAN traffic leaves through wan1."""
    if src.user == "carol" or dst.startswith("carol"):
        return "blocked"
    if dst == "wan":
        return "blocked" if "students" in src.extra else ("wan1" if src.user == "bob" else "wan0")
    return "reached" if dst.split("@")[0].rstrip("0123456789") == src.user else "blocked"


def policy_mismatches(jobs: list[ProbeJob]) -> list[str]:
    """Every (job, peer or WAN) whose outcome is not what pool.SDN_POLICIES say (a missing result counts)."""
    out = []
    for j in jobs:
        for dst in [*(o.label for o in jobs if o is not j), "wan"]:
            want, got = expected(j, dst), j.seen.get(dst, "no result")
            if _short(got) != want:
                out.append(f"{j.label} -> {dst}: expected {want}, saw {got}")
    return out


def start_problems(jobs: list[ProbeJob]) -> list[str]:
    """A line for each job whose event log shows other than exactly one start (an eviction, a lost shadow or
    starter, or no start at all). Jobs whose log was not read (starts None: not run by run_probes) are skipped."""
    return [f"{j.label}: {eventlog.describe(f'{j.cluster}.0', j.starts)}" for j in jobs
            if j.starts is not None and j.starts != ["execute"]]


def _short(v: str) -> str:
    return "reached" if v == "reached" else ("blocked" if v.startswith("blocked") else v)
