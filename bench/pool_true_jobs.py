#!/usr/bin/env python3
"""50 `/bin/true` jobs on the real pool, with Lark and without, in one run (issue 15, benchmark 2).

Starts the pool testbed (testbed/pool.py: central manager, two EPs with 4 static slots and their own larkd, the
core Open vSwitch with lark-controller), then submits two clusters of BENCH_JOBS (50) `/bin/true` jobs as one
user, one after the other, and stops the pool (also on failure):
  1. "lark":  the pool's normal configuration: the STARTER wrapper (lark-starter) gives every job an empty netns,
     the PREPARE_JOB hook asks larkd for the job's plan, the USER_JOB_WRAPPER (lark-job-wrapper) has larkd build
     the job's network (bridge mode, static address, limits, counters, controller registration) before it starts
     /bin/true, and once /bin/true has ended holds the exit barrier: it waits while larkd pushes the final counters
     to the schedd, then exits like /bin/true. (There is no JOB_EXIT hook any more: on HTCondor 24.x/25.x any
     JOB_EXIT hook makes the starter exit during output transfer, and file-transfer jobs are evicted forever.)
  2. "plain": the same EPs after a drop-in (NO_LARK_CONF) and `condor_reconfig`: STARTER is the real
     condor_starter, USER_JOB_WRAPPER and STARTER_JOB_HOOK_KEYWORD are empty. So the job start path runs no Lark
     code at all: no starter wrapper, no hook, no job wrapper; the job runs in the EP's own network namespace as
     on a stock EP (NO_JOB_NETWORKING is only set by lark-starter). What remains of Lark on the EP is idle
     background work, off every job's path: larkd itself (polling no jobs) and the 30 s STARTD_CRON machine-ad
     probe. Why this way: a submit attribute or policy giving NetworkType "none" would still run the starter
     wrapper, the hook, the job wrapper and a larkd round trip, i.e. measure Lark's "none" path, not "no Lark";
     a second slot type could clear USER_JOB_WRAPPER and the hook keyword for its starters (a starter reads
     `slot_type_N.` settings), but the startd launches every slot's starter through the one STARTER, so
     lark-starter would still run for the "plain" jobs. Reconfiguring the two EPs between the halves changes
     nothing else: same slots, same schedd, same user, same submit file.
The jobs use file transfer, as on a pool without a shared filesystem (/bin/true is the EP's own, nothing is sent
or comes back): both halves pay the starter's input and output transfer steps.
The bench checks what the StarterLog shows: every "lark" job's starter used lark-job-wrapper and ran the
PREPARE_JOB hook (`PREPARE_JOB (<path>) invoked.`), and no "plain" job's starter used a wrapper or ran a hook, else
it fails. lark-starter leaves no line there; that it is gone in the "plain" half follows from STARTER in the
drop-in (and shows in the step table: activate -> starter banner). It also reads each half's job event log: when a
job started more than once or was evicted, the bench prints no figures and exits 1.

Per job, from the EPs' own logs (STARTD_DEBUG/STARTER_DEBUG = D_SUB_SECOND, millisecond timestamps, one clock):
  start_ms  the startd receiving the shadow's activate_claim (StartLog) -> the starter seeing the job's process
            exit (StarterLog). /bin/true runs for about a millisecond, so this is the start path: starter wrapper,
            starter start-up, input transfer, PREPARE_JOB hook, Create_Process, and (with Lark) the job wrapper
            setting up the network before it starts /bin/true. With Lark it also holds the exit barrier: the job's
            process is the wrapper, which exits only after larkd's final push, and the StarterLog has no line for
            /bin/true's own end, so the barrier cannot be told apart from the start there. Added start latency =
            lark - plain, at p50 and at p99 (an upper bound: it includes the barrier).
  slot_ms   activate_claim -> the startd seeing the starter exit (StartLog): the whole time the slot is busy,
            including output transfer and the starter's clean-up.
  barrier_ms  the exit barrier as larkd serves it (its LarkdLog line `exit barrier of job J: pushed in N ms`: the
            wrapper's `push` request -> the answer, i.e. reading the counters and editing the job's ad at the schedd);
            the wrapper waits for this after /bin/true ended, so it is part of start_ms and slot_ms.
The job ad's view is coarser: JobCurrentStartExecutingDate - JobCurrentStartDate (the shadow's activation to
the starter's "executing" report; whole seconds, and with Lark it is reached before the job wrapper runs) is
printed as a mean for reference. wall_s: condor_submit -> every job of the cluster terminated (condor_wait on
the cluster's user log), including negotiation; both halves start from all slots unclaimed.

Prints a table, the issue-27 goals for the pool with met/missed (bench/goals.py), then one line:
  jobs=<n> wall_lark_s=<x> wall_plain_s=<y> start_p50_added_ms=<a> start_p99_added_ms=<b> slot_p50_added_ms=<c>
  wall_ratio=<x/y> barrier_p50_ms=<d> barrier_p99_ms=<e> goals_met=<m>/<all> [missed=<keys>]
Run as root; the pool shares the testbed's root, so hold the lock: `flock /tmp/lark-testbed.lock` (make bench does).
"""
from __future__ import annotations

import logging
import math
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO / "testbed"))
import eventlog  # noqa: E402 (testbed/, standard library only)

sys.path.insert(0, str(HERE))
import goals  # noqa: E402 (bench/goals.py)

N_JOBS = int(os.environ.get("BENCH_JOBS", "50"))
USER = "alice"
log = logging.getLogger("pool-true-jobs")

# On every EP for both halves: millisecond timestamps in the startd's and starters' logs.
TIMING_CONF = "# bench/pool_true_jobs.py: millisecond log timestamps\n" \
              "STARTD_DEBUG = D_SUB_SECOND\nSTARTER_DEBUG = D_SUB_SECOND\n"
# The "plain" half: the stock job start path (the real starter, no job wrapper, no starter hooks).
NO_LARK_CONF = "# bench/pool_true_jobs.py: Lark off the job start path\n" \
               "STARTER = $(SBIN)/condor_starter\nUSER_JOB_WRAPPER =\nSTARTER_JOB_HOOK_KEYWORD =\n"


# -- pure parts (tests/unit/test_pool_true_jobs.py) -------------------------------------------------------------
_TS = re.compile(r"^(\d\d/\d\d/\d\d \d\d:\d\d:\d\d(?:\.\d+)?) ")


def log_time(line: str) -> float | None:
    """Epoch seconds of an HTCondor daemon log line (`MM/DD/YY HH:MM:SS[.mmm] ...`, local time), else None."""
    m = _TS.match(line)
    if not m:
        return None
    stamp = m.group(1)
    fmt = "%m/%d/%y %H:%M:%S.%f" if "." in stamp else "%m/%d/%y %H:%M:%S"
    return datetime.strptime(stamp, fmt).timestamp()


@dataclass
class StarterRun:
    """One condor_starter's view of one job (from StarterLog.slotN)."""
    job: str = ""
    up: float | None = None               # the starter's "STARTING UP" banner
    started: float | None = None          # "Create_Process succeeded"
    exited: float | None = None           # "Process exited"
    ending: float | None = None           # "EXITING WITH STATUS"
    wrapper: str = ""                     # the USER_JOB_WRAPPER it used, if any
    hooks: list[str] = field(default_factory=list)   # the hooks it ran: PREPARE_JOB, JOB_EXIT, ...


def parse_starter_log(text: str) -> dict[str, StarterRun]:
    """Job id -> what its starter logged. One StarterLog.slotN holds that slot's starters one after the other,
    each beginning with its `STARTING UP` banner (with D_SUB_SECOND the lines carry no `(pid:N)`)."""
    runs: list[StarterRun] = []
    for line in text.splitlines():
        t = log_time(line)
        if t is None:
            continue
        msg = re.sub(r"^\S+ \S+ (\(pid:\d+\) )?", "", line)
        if "condor_starter (CONDOR_STARTER) STARTING UP" in msg or not runs:
            runs.append(StarterRun())
        run = runs[-1]
        if run.up is None and "STARTING UP" in msg:
            run.up = t
        if j := re.match(r"Starting a \w+ universe job with ID: (\d+\.\d+)", msg):
            run.job = j.group(1)
        elif w := re.match(r"Using wrapper (\S+) to exec", msg):
            run.wrapper = w.group(1)
        elif msg.startswith("Create_Process succeeded"):
            run.started = t
        elif msg.startswith("Process exited"):
            run.exited = t
        elif "EXITING WITH STATUS" in msg:
            run.ending = t
        elif h := re.match(r"(?:HOOK_)?([A-Z_]+) \(.*\) invoked", msg):
            # `PREPARE_JOB (/opt/lark/bin/lark-prepare-job) invoked.` (StarterHookMgr.cpp names it by its type);
            # UPDATE_JOB_INFO and JOB_EXIT are logged as `HOOK_UPDATE_JOB_INFO (...) invoked` and
            # `HOOK_JOB_EXIT (...) invoked with reason: ...`: one name for each, without HOOK_.
            run.hooks.append(h.group(1))
    return {r.job: r for r in runs if r.job}


def parse_start_log(text: str) -> dict[str, tuple[float, float | None]]:
    """Job id -> (activate_claim received, starter exited) from a StartLog: each slot's lines in order."""
    current: dict[str, tuple[str, float]] = {}          # slot -> (job, activate time)
    out: dict[str, tuple[float, float | None]] = {}
    pending: dict[str, float] = {}                      # slot -> activate time, job id not seen yet
    for line in text.splitlines():
        t = log_time(line)
        m = re.search(r" (slot\d+(?:_\d+)?): (.*)$", line)
        if t is None or not m:
            continue
        slot, msg = m.groups()
        if msg.startswith("Got activate_claim request"):
            pending[slot] = t
        elif (j := re.match(r"Remote job ID is (\d+\.\d+)", msg)) and slot in pending:
            current[slot] = (j.group(1), pending.pop(slot))
            out[j.group(1)] = (current[slot][1], None)
        elif msg.startswith("State change: starter exited") and slot in current:
            job, activated = current.pop(slot)
            out[job] = (activated, t)
    return out


_BARRIER = re.compile(r"exit barrier of job (\d+\.\d+): (?:not )?pushed in ([0-9.]+) ms(?: \(([^)]*)\))?")


def parse_barriers(text: str) -> dict[str, float]:
    """Job id -> ms larkd took to serve its exit barrier (request -> answer), from a LarkdLog."""
    return {m.group(1): float(m.group(2)) for m in _BARRIER.finditer(text)}


def barrier_parts(text: str) -> dict[str, list[float]]:
    """The parts larkd's barrier line names (`peer 0.4 ms, counters 1.0 ms, ...`): part -> ms, one per job."""
    parts: dict[str, list[float]] = {}
    for m in _BARRIER.finditer(text):
        for part in (m.group(3) or "").split(", "):
            if (p := re.fullmatch(r"(.+) ([0-9.]+) ms", part)):
                parts.setdefault(p.group(1), []).append(float(p.group(2)))
    return parts


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile (0-100) by the nearest-rank method: a value that was measured, never interpolated."""
    if not values:
        raise ValueError("percentile of no values")
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


def job_ad_start_s(ad: dict) -> float | None:
    """The job ad's own start latency: the shadow's activation -> the starter's report that the job executes."""
    start, executing = ad.get("JobCurrentStartDate"), ad.get("JobCurrentStartExecutingDate")
    if start is None or executing is None:
        return None
    return float(executing) - float(start)


@dataclass
class Half:
    name: str
    wall_s: float
    start_ms: list[float]
    slot_ms: list[float]
    ad_start_s: list[float]
    steps: dict[str, float] = field(default_factory=dict)
    barrier_ms: list[float] = field(default_factory=list)   # larkd's side of each job's exit barrier (lark half)
    barrier_parts: dict[str, list[float]] = field(default_factory=dict)   # its parts, as larkd's log names them

    def row(self) -> list[str]:
        ad = f"{sum(self.ad_start_s) / len(self.ad_start_s):.2f}" if self.ad_start_s else "-"
        return [self.name, str(len(self.start_ms)), f"{self.wall_s:.1f}",
                f"{percentile(self.start_ms, 50):.0f}", f"{percentile(self.start_ms, 99):.0f}",
                f"{percentile(self.slot_ms, 50):.0f}", f"{percentile(self.slot_ms, 99):.0f}", ad]


def measure(starters: dict[str, StarterRun], slots: dict[str, tuple[float, float | None]], jobs: list[str],
            want_lark: bool) -> tuple[list[float], list[float]]:
    """(start_ms, slot_ms) for each job; raises when a job is missing from the logs or ran on the wrong path."""
    start_ms, slot_ms = [], []
    for job in jobs:
        run, slot = starters.get(job), slots.get(job)
        if run is None or slot is None or run.exited is None or slot[1] is None:
            raise RuntimeError(f"job {job}: not complete in the EPs' StartLog/StarterLog (starter {run}, "
                               f"slot {slot}); see the pool's last-run logs")
        lark = "lark-job-wrapper" in run.wrapper and "PREPARE_JOB" in run.hooks
        plain = not run.wrapper and not run.hooks
        if (lark, plain) != (want_lark, not want_lark):
            raise RuntimeError(f"job {job}: expected the {'Lark' if want_lark else 'plain'} start path, its "
                               f"starter used wrapper {run.wrapper!r} and hooks {run.hooks}")
        start_ms.append((run.exited - slot[0]) * 1000)
        slot_ms.append((slot[1] - slot[0]) * 1000)
    return start_ms, slot_ms


# Where a job's time on the EP goes, in order: (label, from, to); None is the startd's view (StartLog).
# There is no separate exit-barrier step any more: the barrier was the JOB_EXIT hook, after the job's process
# exited; it is in the job wrapper now (lark/job/wrapper.py), and the starter only sees the wrapper exit, after
# the barrier. The StarterLog has no line for the end of /bin/true itself, so the barrier is inside the third step
# and not measured on its own.
STEPS = [("activate -> starter banner (STARTER wrapper)", "activate", "up"),
         ("banner -> Create_Process (input transfer, PREPARE_JOB hook)", "up", "started"),
         ("Create_Process -> exit (job wrapper: network, /bin/true, exit barrier)", "started", "exited"),
         ("exit -> starter exits (output transfer, clean-up)", "exited", "ending")]


def breakdown(starters: dict[str, StarterRun], slots: dict[str, tuple[float, float | None]],
              jobs: list[str]) -> dict[str, float]:
    """Median ms of each step in STEPS over the jobs that logged both ends of it."""
    out = {}
    for label, a, b in STEPS:
        spans = []
        for job in jobs:
            run, slot = starters.get(job), slots.get(job)
            if run is None or slot is None:
                continue
            ends = {"activate": slot[0], "up": run.up, "started": run.started, "exited": run.exited,
                    "ending": run.ending}
            if ends[a] is not None and ends[b] is not None:
                spans.append((ends[b] - ends[a]) * 1000)
        out[label] = percentile(spans, 50) if spans else float("nan")
    return out


def breakdown_table(halves: list[Half]) -> str:
    rows = [["step (p50 ms)", *[h.name for h in halves]]]
    rows += [[label, *[f"{h.steps.get(label, float('nan')):.0f}" for h in halves]] for label, _, _ in STEPS]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths)))
                     for r in rows)


def summary(lark: Half, plain: Half) -> str:
    added50 = percentile(lark.start_ms, 50) - percentile(plain.start_ms, 50)
    added99 = percentile(lark.start_ms, 99) - percentile(plain.start_ms, 99)
    slot50 = percentile(lark.slot_ms, 50) - percentile(plain.slot_ms, 50)
    return (f"jobs={len(lark.start_ms)} wall_lark_s={lark.wall_s:.1f} wall_plain_s={plain.wall_s:.1f} "
            f"start_p50_added_ms={added50:.0f} start_p99_added_ms={added99:.0f} slot_p50_added_ms={slot50:.0f}")


def issue27_goals(lark: Half, plain: Half) -> list[goals.Goal]:
    """Issue 27's goals for the pool, from the two halves of one run."""
    barrier = percentile(lark.barrier_ms, 50) if lark.barrier_ms else float("nan")
    return [
        goals.Goal("start_p50_added_ms", "start latency added, p50",
                   percentile(lark.start_ms, 50) - percentile(plain.start_ms, 50), "<=", 50),
        goals.Goal("start_p99_added_ms", "start latency added, p99",
                   percentile(lark.start_ms, 99) - percentile(plain.start_ms, 99), "<=", 250),
        goals.Goal("slot_p50_added_ms", "slot busy time added, p50",
                   percentile(lark.slot_ms, 50) - percentile(plain.slot_ms, 50), "<=", 100),
        goals.Goal("wall_ratio", f"{len(lark.start_ms)} jobs' wall time, lark / plain", lark.wall_s / plain.wall_s,
                   "<=", 1.10, "x"),
        goals.Goal("barrier_p50_ms", "exit barrier (larkd: request -> answer), p50", barrier, "<=", 20),
    ]


def final_line(lark: Half, plain: Half) -> str:
    """summary() with the wall time ratio, the barrier and the goals: the bench's one key=value line."""
    b50 = percentile(lark.barrier_ms, 50) if lark.barrier_ms else float("nan")
    b99 = percentile(lark.barrier_ms, 99) if lark.barrier_ms else float("nan")
    return (f"{summary(lark, plain)} wall_ratio={lark.wall_s / plain.wall_s:.2f} barrier_p50_ms={b50:.1f} "
            f"barrier_p99_ms={b99:.1f} {goals.fields(issue27_goals(lark, plain))}")


def table(halves: list[Half]) -> str:
    heads = ["path", "jobs", "wall s", "start p50 ms", "start p99 ms", "slot p50 ms", "slot p99 ms",
             "job ad start s (mean)"]
    rows = [heads] + [h.row() for h in halves]
    widths = [max(len(r[i]) for r in rows) for i in range(len(heads))]
    return "\n".join("  ".join(c.rjust(w) for c, w in zip(r, widths)) for r in rows)


# -- the run ----------------------------------------------------------------------------------------------------
def _ep_conf(pool, ep: str, name: str, text: str | None) -> None:
    path = pool.root_of(ep) / "etc/condor/config.d" / name
    if text is None:
        path.unlink(missing_ok=True)
    else:
        path.write_text(text)


def _reconfig(pool) -> None:
    for ep in pool.EPS:
        pool.run(pool.in_machine(ep, ["condor_reconfig"]))
    time.sleep(3)  # the startd re-reads its config and re-probes the starter (`$(STARTER) -classad`)
    _wait_unclaimed(pool)


def _wait_unclaimed(pool, timeout: float = 120) -> None:
    """Every slot of both EPs in the collector, Unclaimed: each half starts from the same state."""
    deadline = time.time() + timeout
    seen = ""
    while time.time() < deadline:
        seen = pool.run(pool.in_machine("cm", ["condor_status", "-af", "State"]), check=False).stdout
        states = seen.split()
        if len(states) == 4 * len(pool.EPS) and set(states) == {"Unclaimed"}:
            return
        time.sleep(1)
    raise RuntimeError(f"pool slots not all Unclaimed after {timeout:.0f} s: {seen!r}")


def _read_barriers(pool) -> tuple[dict[str, float], str]:
    out: dict[str, float] = {}
    text = ""
    for ep in pool.EPS:
        f = pool.root_of(ep) / "var/log/condor/LarkdLog"
        if f.exists():
            text += f.read_text(errors="replace")
    out.update(parse_barriers(text))
    return out, text


def _read_logs(pool) -> tuple[dict[str, StarterRun], dict[str, tuple[float, float | None]]]:
    starters: dict[str, StarterRun] = {}
    slots: dict[str, tuple[float, float | None]] = {}
    for ep in pool.EPS:
        logdir = pool.root_of(ep) / "var/log/condor"
        for f in sorted(logdir.glob("StarterLog.slot*")):
            starters.update(parse_starter_log(f.read_text(errors="replace")))
        slots.update(parse_start_log((logdir / "StartLog").read_text(errors="replace")))
    return starters, slots


def _history(pool, cluster: int) -> list[dict]:
    cp = pool.run(pool.in_machine("cm", ["condor_history", str(cluster), "-af", "ProcId", "ExitCode",
                                         "JobCurrentStartDate", "JobCurrentStartExecutingDate"]), check=False)
    out = []
    for line in cp.stdout.splitlines():
        parts = line.split()
        if len(parts) == 4:
            out.append({k: (None if v == "undefined" else v) for k, v in
                        zip(["ProcId", "ExitCode", "JobCurrentStartDate", "JobCurrentStartExecutingDate"], parts)})
    return out


class Restarted(RuntimeError):
    """Jobs of a half started more than once or were evicted: no figures from such a run."""


def restarts(log_path: Path, cluster: int, n: int) -> list[str]:
    """A line for each of the cluster's n jobs whose event log shows other than exactly one start."""
    jobs = [f"{cluster}.{p}" for p in range(n)]
    return [eventlog.describe(job, events) for job, events in eventlog.not_once(log_path, jobs).items()]


SUBMIT = ("universe = vanilla\nexecutable = /bin/true\ntransfer_executable = false\n"
          "should_transfer_files = YES\nwhen_to_transfer_output = ON_EXIT\n"
          "log = job.log\noutput = /dev/null\nerror = /dev/null\nrequest_cpus = 1\nrequest_memory = 64\n"
          "queue {n}\n")


def run_half(pool, name: str) -> Half:
    t0 = time.monotonic()
    cluster = pool.submit_as(USER, f"bench-true-{name}", SUBMIT.format(n=N_JOBS))
    job_log = pool.HOME / USER / f"bench-true-{name}" / "job.log"
    wait = pool.run(pool.in_machine("cm", ["condor_wait", "-wait", str(60 + 10 * N_JOBS),
                                           f"/home/{USER}/bench-true-{name}/job.log", str(cluster)], user=USER),
                    check=False)
    wall = time.monotonic() - t0
    if wait.returncode != 0:
        pool.run(pool.in_machine("cm", ["condor_rm", str(cluster)]), check=False)
        again = restarts(job_log, cluster, N_JOBS)
        raise (Restarted if again else RuntimeError)(
            f"{name}: cluster {cluster} did not finish: {wait.stdout.strip()} {wait.stderr.strip()}"
            + "".join(f"\n  {line}" for line in again))
    again = restarts(job_log, cluster, N_JOBS)
    if again:
        raise Restarted(f"{name}: {len(again)} of {N_JOBS} jobs did not start exactly once:"
                        + "".join(f"\n  {line}" for line in again))
    ads = []
    for _ in range(30):  # the history file is written just after the terminate event
        ads = _history(pool, cluster)
        if len(ads) == N_JOBS:
            break
        time.sleep(1)
    failed = [a["ProcId"] for a in ads if a["ExitCode"] != "0"]
    if len(ads) != N_JOBS or failed:
        raise RuntimeError(f"{name}: cluster {cluster}: {len(ads)} of {N_JOBS} jobs in the history, "
                           f"failed procs {failed}")
    time.sleep(2)  # the startd logs "starter exited" after the shadow's last word
    starters, slots = _read_logs(pool)
    jobs = [f"{cluster}.{p}" for p in range(N_JOBS)]
    start_ms, slot_ms = measure(starters, slots, jobs, want_lark=(name == "lark"))
    ad_s = [s for a in ads if (s := job_ad_start_s(a)) is not None]
    log.info("%s: cluster %d, %d jobs in %.1f s", name, cluster, N_JOBS, wall)
    barriers, larkd_log = _read_barriers(pool)
    barrier_ms = [barriers[j] for j in jobs if j in barriers]
    if name == "lark" and len(barrier_ms) != N_JOBS:
        log.warning("lark: %d of %d jobs have an exit barrier line in the EPs' LarkdLog", len(barrier_ms), N_JOBS)
    return Half(name, wall, start_ms, slot_ms, ad_s, breakdown(starters, slots, jobs), barrier_ms,
                barrier_parts(larkd_log) if name == "lark" else {})


def main() -> int:
    logging.basicConfig(level=logging.INFO, format="pool-true-jobs: %(message)s")
    import pool  # noqa: E402 (the testbed, stdlib only)

    pool.tb.prepare("bench/pool_true_jobs.py")
    if pool.tb.load_state().get("master_pid"):
        pool.tb.stop()  # the one-machine testbed runs from the same root
    try:
        pool.start()
        for ep in pool.EPS:
            _ep_conf(pool, ep, "97-bench-timing.conf", TIMING_CONF)
        _reconfig(pool)
        lark = run_half(pool, "lark")
        for ep in pool.EPS:
            _ep_conf(pool, ep, "97-bench-no-lark.conf", NO_LARK_CONF)
        _reconfig(pool)
        plain = run_half(pool, "plain")
    except Restarted as e:
        print(f"pool-true-jobs: no figures from this run: {e}\n(an evicted job starts again: its start and slot "
              "times would count twice, or mix two starts)")
        return 1
    finally:
        pool.down()
        left = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
        if pool.PREFIX in left:
            log.error("pool namespaces are still there: %s", left)
    print(f"{N_JOBS} /bin/true jobs per half on the pool testbed (2 EPs x 4 static slots), "
          f"{os.cpu_count()} CPUs (shared machine), lark half first")
    print(table([lark, plain]))
    print()
    print(breakdown_table([lark, plain]))
    if lark.barrier_ms:
        b = lark.barrier_ms
        print(f"exit barrier (larkd's LarkdLog, {len(b)} jobs): p50 {percentile(b, 50):.1f} ms, "
              f"p99 {percentile(b, 99):.1f} ms, max {max(b):.1f} ms")
        for part, ms in lark.barrier_parts.items():
            print(f"  of which {part}: p50 {percentile(ms, 50):.1f} ms, p99 {percentile(ms, 99):.1f} ms")
    print()
    print(goals.table(issue27_goals(lark, plain), "issue 27 goals, pool testbed"))
    print()
    print(final_line(lark, plain))
    return 0


if __name__ == "__main__":
    sys.exit(main())
