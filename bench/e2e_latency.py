"""What a job waits for, end to end: from `lark-job-wrapper` being exec'd to the job's program running in its
networked namespace, through the real socket and a real larkd on the fake execution point; and the same for
the CNI chain a container runtime would run (bridge + host-local + bandwidth + firewall, Debian's
containernetworking-plugins), measured side by side in one run. Sequential, then 16, 64 and 128 at once.

Lark path: the test starter (tests/helpers/test_starter.c) clones each job into an empty netns and execs `stamp
lark-job-wrapper stamp`, with LARK_SOCKET in the environment the starter passes on (no `env` exec in between, which
HTCondor does not have either): the first stamp marks the wrapper's exec, the second the job's program running (NAT,
static address, limits both ways from the slot's Bandwidth, counters). The wrapper is the one HTCondor runs by
default (condor_config.d/50-lark.conf LARK_JOB_WRAPPER): the compiled lark/job/launcher/job_wrapper.c, built here as
`lark install-hook` builds it (lark/hook_launcher.install_job_wrapper, `build_compiled`), with the Python wrapper as
its fallback behind a counter (a job that fell back is counted and printed: it did not take the compiled path). The
goals are computed from it. One extra sequential row, alternated job by job with the compiled one and not in the
goals, runs the Python wrapper (the pip console script) for comparison, with the share of its interpreter's start
and imports.
The fake execution point's directory (larkd's run_dir and state_dir) is on tmpfs (/dev/shm), as run_dir (/run/lark)
is on an execution point.
Teardown: what the starter waits for after its job's program ended (larkd tears down after the starter exits, so
nothing of Lark's should be in it; under load the figure is mostly this harness noticing the exit late) and the
time until the job's netns and veth are gone from the kernel. Not measured here: the exit barrier (the wrapper's
`push` at the job's end, for which larkd edits the job's ad at its schedd), which the fake execution point has no
schedd for (larkd announces no barrier and the wrapper execs the job); bench/pool_true_jobs.py measures it on the
pool.
CNI path: a runtime-like driver takes a timestamp, runs ADD for the chain (each plugin with the previous result),
then execs `stamp` in the container's netns; DEL runs synchronously (a runtime waits for it).

`--quick`: 10 sequential jobs and one 16-job batch (a smoke run; the full run is what `make bench` does).
Environment: BENCH_N (sequential jobs of each wrapper, default 50), BENCH_CONCURRENCY (default "16,64,128").

Prints a table, the issue-27 goals for the fake execution point with met/missed (bench/goals.py), then one line:
e2e_p50_ms=<x> e2e_p99_ms=<y> cni_p50_ms=<z> speedup=<z/x> c64_p99_ms=<w> c64_failures=<n> setups_per_s=<r>
py_e2e_p50_ms=<the python wrapper's p50> fallbacks=<n> goals_met=<m>/<all> [missed=<keys>]
"""
from __future__ import annotations

import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(HERE))
import goals  # noqa: E402 (bench/goals.py)
import runfs  # noqa: E402 (bench/runfs.py)

QUICK = "--quick" in sys.argv[1:]
N_SEQ = int(os.environ.get("BENCH_N", "10" if QUICK else "50"))
CONCURRENCY = [int(c) for c in os.environ.get("BENCH_CONCURRENCY", "16" if QUICK else "16,64,128").split(",") if c]
PY_FIRST = 500_000  # ClusterIds of the Python wrapper's comparison jobs (the compiled ones' start at 1000)
CNI_PATH = "/usr/lib/cni"
LIMIT_MBIT = 100


def pct(xs: list[float], p: float) -> float:
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


def build_stamp(dest: Path) -> Path:
    out = dest / "stamp"
    subprocess.run(["gcc", "-O2", "-Wall", "-o", str(out), str(HERE / "stamp.c")], check=True)
    out.chmod(0o755)
    return out


def write_launcher(dest: Path) -> Path:
    """lark-job-wrapper as pip installs it (the console script of setup.py's entry point), on the job's Python."""
    from helpers.fakehost import JOB_PY
    out = dest / "lark-job-wrapper"
    out.write_text(f"#!{JOB_PY}\nimport sys\nfrom lark.job.wrapper import main\nif __name__ == '__main__':\n"
                   "    sys.argv[0] = sys.argv[0].removesuffix('.exe')\n    sys.exit(main())\n")
    out.chmod(0o755)
    return out


def counted_fallback(dest: Path, launcher: Path) -> Path:
    """The compiled wrapper's fallback here: the Python wrapper, after leaving a file in dest/fallbacks, so that a
    run can say how many jobs did not take the compiled path (`fallbacks`)."""
    marks = dest / "fallbacks"
    marks.mkdir()
    marks.chmod(0o1777)
    out = dest / "lark-job-wrapper-counted"
    out.write_text(f'#!/bin/sh\n: > {marks}/$$\nexec {launcher} "$@"\n')
    out.chmod(0o755)
    return out


def fallbacks(dest: Path) -> int:
    """How many jobs the compiled wrapper handed to its fallback (counted_fallback)."""
    return len(list((dest / "fallbacks").iterdir()))


def build_compiled(dest: Path, fallback: Path) -> Path:
    """The compiled job wrapper as `lark install-hook` builds it (same source, flags and mode, root:root 0755),
    with `fallback` as the Python wrapper it execs for every case it does not handle."""
    from lark.hook_launcher import install_job_wrapper
    out = dest / "lark-job-wrapper-fast"
    if not install_job_wrapper(out, fallback):
        raise SystemExit(f"the compiled job wrapper could not be built (its reason is logged above); {out} would "
                         "be the Python wrapper")
    return out


def larkd_setup_by_job(host, first: int, n: int) -> dict[int, float]:
    """ClusterId -> larkd's time in JobNetworker.setup for jobs first..first+n-1 (its log line per job, from the hop
    to the worker thread), to tell it apart from the rest of the end-to-end figure."""
    got = {}
    for line in (host.tmp / "larkd.log").read_text().splitlines():
        m = re.search(r"networked job (\d+)\.0 on \S+: .* in ([0-9.]+) ms$", line)
        if m and first <= int(m.group(1)) < first + n:
            got[int(m.group(1))] = float(m.group(2))
    return got


def larkd_setup_ms(host, first: int, n: int) -> list[float]:
    return list(larkd_setup_by_job(host, first, n).values())


def wrapper_start_ms(host, stamp: Path, n: int) -> list[float]:
    """The job's Python starting and importing the wrapper, as the job's user, without any request: the part of
    the end-to-end figure that is the interpreter's, not larkd's."""
    from helpers.fakehost import JOB_PY
    code = "import os, sys; from lark.job import wrapper; os.execv(sys.argv[1], sys.argv[1:])"
    out = []
    for _ in range(n):
        cp = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "env",
                             f"PYTHONPATH={REPO}", str(stamp), JOB_PY, "-c", code, str(stamp)],
                            capture_output=True, text=True, check=True)
        st = stamps(cp.stdout)
        out.append((st[1] - st[0]) / 1e6)
    return out


def stamps(stdout: str) -> list[int]:
    return [int(line.split()[1]) for line in stdout.splitlines() if line.startswith("stamp ")]


# -- Lark: the real wrapper, socket and larkd on the fake execution point ----------------------------------
def lark_batch(host, stamp: Path, wrapper: Path, n: int, first: int) -> dict:
    """n jobs started at once through `wrapper`. Returns ms figures per job: "setup" (wrapper exec -> job's
    program running), "starter" (job's program ran -> its starter exited: what the starter waits for at the
    job's end), "gone" (job's program ran -> its netns and host veth are gone); "failures"; "rate" (setups per
    second)."""
    slots = [f"b{first + i}" for i in range(n)]
    for i, slot in enumerate(slots):
        host.publish_ad(slot, f"ClusterId = {first + i}\nProcId = 0", f"Bandwidth = {LIMIT_MBIT}")
    # The job's environment comes through the starter, as HTCondor gives the job its own: the first stamp execs the
    # wrapper itself (an `env` exec in between added ~0.8 ms to every figure, which no job has).
    job_env = {**os.environ, "LARK_SOCKET": host.cfg.socket, "PYTHONPATH": str(REPO)}
    t_start = time.time_ns()
    procs = [subprocess.Popen(host.in_host([host.starter, "-a", slot, "-u", "65534", "--", str(stamp), str(wrapper),
                                            str(stamp)]),
                              env=job_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for slot in slots]
    # One thread per starter notices its exit as it happens (a serial wait would see later exits late).
    def wait(p: subprocess.Popen) -> tuple[str, str, int, int]:
        out, err = p.communicate(timeout=300)
        return out, err, p.returncode, time.time_ns()
    with ThreadPoolExecutor(n) as ex:
        results = list(ex.map(wait, procs))
    setup, starter, failures, ran_at, ran = [], [], 0, [], {}
    for slot, (out, err, rc, exited_ns) in zip(slots, results):
        st = stamps(out)
        if rc != 0 or len(st) != 2:
            failures += 1
            sys.stderr.write(f"job on {slot} failed ({rc}): {err.strip()[-300:]}\n")
            continue
        setup.append((st[1] - st[0]) / 1e6)
        starter.append((exited_ns - st[1]) / 1e6)
        ran_at.append(st[1])
        ran[slot] = st[1]
    rate = len(ran_at) / ((max(ran_at) - t_start) / 1e9) if ran_at else 0.0
    return {"setup": setup, "starter": starter, "gone": wait_gone(host, slots, ran), "failures": failures,
            "rate": rate}


def wait_gone(host, slots: list[str], ran: dict[str, int], timeout: float = 60) -> list[float]:
    """Per job: ms from its program running (it exits at once) until its netns name and host veth are gone."""
    pending, gone = {s for s in slots if s in ran}, {}
    deadline = time.perf_counter() + timeout
    while pending and time.perf_counter() < deadline:
        names = set(os.listdir("/run/netns"))
        links = subprocess.run(["ip", "-n", host.host_ns, "-o", "link", "show"], capture_output=True,
                               text=True).stdout
        now = time.time_ns()
        for slot in list(pending):
            if f"{host.cfg.netns_prefix}{slot}" not in names and f"lk-{slot}:" not in links and \
                    f"lk-{slot}@" not in links:
                gone[slot] = (now - ran[slot]) / 1e6
                pending.discard(slot)
        time.sleep(0.002)
    if pending:
        sys.stderr.write(f"still in the kernel {timeout:g} s after their jobs ended: {sorted(pending)}\n")
    return [gone[s] for s in slots if s in gone]


# -- CNI: a runtime-like driver running the plugin chain -----------------------------------------------------
def cni_conf(tmp: str) -> list[dict]:
    return [
        {"type": "bridge", "bridge": "cnibr0", "isGateway": True, "ipMasq": True,
         "ipam": {"type": "host-local", "subnet": "10.215.0.0/21", "dataDir": f"{tmp}/cni-ipam"}},
        {"type": "bandwidth", "ingressRate": LIMIT_MBIT * 1_000_000, "ingressBurst": LIMIT_MBIT * 50_000,
         "egressRate": LIMIT_MBIT * 1_000_000, "egressBurst": LIMIT_MBIT * 50_000},
        {"type": "firewall", "backend": "iptables"},
    ]


def cni_call(plugin: dict, cmd: str, cid: str, pid: int, prev: dict | None) -> dict:
    conf = {"cniVersion": "1.0.0", "name": "benchnet", **plugin}
    if prev is not None:
        conf["prevResult"] = prev
    env = {"CNI_COMMAND": cmd, "CNI_CONTAINERID": cid, "CNI_NETNS": f"/proc/{pid}/ns/net", "CNI_IFNAME": "eth0",
           "CNI_PATH": CNI_PATH, "PATH": os.environ["PATH"]}
    cp = subprocess.run([f"{CNI_PATH}/{plugin['type']}"], input=json.dumps(conf), env=env, capture_output=True,
                        text=True)
    if cp.returncode != 0:
        raise RuntimeError(f"CNI {plugin['type']} {cmd} failed: {cp.stdout.strip()} {cp.stderr.strip()}")
    return json.loads(cp.stdout) if cp.stdout.strip() else {}


def cni_job(chain: list[dict], stamp: str, i: int, pid: int) -> tuple[float, float]:
    cid = f"bench{i}"
    t0 = time.time_ns()
    prev = None
    for plugin in chain:
        prev = cni_call(plugin, "ADD", cid, pid, prev) or prev
    out = subprocess.run(["nsenter", f"--net=/proc/{pid}/ns/net", stamp], capture_output=True, text=True).stdout
    setup = (stamps(out)[0] - t0) / 1e6
    t1 = time.perf_counter()
    for plugin in reversed(chain):
        cni_call(plugin, "DEL", cid, pid, prev)
    return setup, (time.perf_counter() - t1) * 1000


def cni_inner(stamp: str, n: int, concurrency: int) -> None:
    """Runs inside the fake host's netns; prints {"setup": [...], "del": [...], "failures": n} as JSON."""
    tmp = tempfile.mkdtemp(prefix="lark-bench-cni-")
    chain = cni_conf(tmp)
    sleepers = [subprocess.Popen(["unshare", "--net", "sleep", "600"]) for _ in range(n)]
    me = os.stat("/proc/self/ns/net").st_ino
    for p in sleepers:
        while os.stat(f"/proc/{p.pid}/ns/net").st_ino == me:
            time.sleep(0.001)
    setups, dels, failures = [], [], 0
    try:
        with ThreadPoolExecutor(max(1, concurrency)) as ex:
            futs = [ex.submit(cni_job, chain, stamp, i, p.pid) for i, p in enumerate(sleepers)]
            for f in futs:
                try:
                    s, d = f.result()
                    setups.append(s)
                    dels.append(d)
                except Exception as e:  # noqa: BLE001 - a failed job is a figure, not a crash
                    failures += 1
                    sys.stderr.write(f"{e}\n")
    finally:
        for p in sleepers:
            p.kill()
            p.wait()
        shutil.rmtree(tmp, ignore_errors=True)
    print(json.dumps({"setup": setups, "del": dels, "failures": failures}))


def cni_run(host, stamp: Path, n: int, concurrency: int) -> dict:
    cp = subprocess.run(host.in_host([sys.executable, __file__, "--cni-inner", str(stamp), str(n), str(concurrency)]),
                        capture_output=True, text=True, timeout=600)
    if cp.returncode != 0:
        raise RuntimeError(f"CNI run failed: {cp.stderr.strip()[-2000:]}")
    return json.loads(cp.stdout.strip().splitlines()[-1])


def issue27_goals(summary: dict[str, float], speedup: float) -> list[goals.Goal]:
    """Issue 27's goals for the fake execution point, from this run's figures (the CNI chain ran in the same run)."""
    nan = float("nan")
    c64_failures = int(summary.get("c64_failures", -1))
    return [
        goals.Goal("e2e_p50_ms", "wrapper exec -> job's program, p50", summary["e2e_p50_ms"], "<=", 8),
        goals.Goal("e2e_p99_ms", "wrapper exec -> job's program, p99", summary["e2e_p99_ms"], "<=", 20),
        goals.Goal("speedup", "faster than the CNI chain (its p50 / ours)", speedup, ">=", 4, "x"),
        goals.Goal("c64_p99_ms", "64 at once, p99", summary.get("c64_p99_ms", nan), "<=", 300,
                   extra=f"0 failures ({c64_failures})", extra_ok=c64_failures == 0),
        goals.Goal("setups_per_s", "setups per second, sustained", summary.get("setups_per_s", nan), ">=", 200,
                   "/s"),
    ]


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--cni-inner":
        cni_inner(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
        return 0
    if os.geteuid() != 0:
        raise SystemExit("e2e_latency: run as root (it makes network namespaces)")
    from helpers.fakehost import FakeHost, build_starter
    tmp = Path(tempfile.mkdtemp(prefix="lark-bench-e2e-"))
    tmp.chmod(0o755)  # the job (uid 65534) execs the stamp binary from here
    # larkd's run_dir (records, pins, address locks) is tmpfs on an execution point (/run/lark, docs/admin.md); under
    # /tmp here it was ext4, where replacing a state file took ~2 ms instead of ~0.06 ms.
    host_dir = Path(runfs.tmpfs_dir("lark-bench-e2e-host-"))
    host_dir.chmod(0o755)  # the job reaches larkd's socket below it
    host = FakeHost(str(host_dir), build_starter(str(tmp)))
    stamp = build_stamp(tmp)
    py_wrapper = write_launcher(tmp)
    wrapper = build_compiled(tmp, counted_fallback(tmp, py_wrapper))
    rows: list[tuple] = []
    leaked: dict = {}
    summary: dict[str, float] = {}
    try:
        host.start()
        # Sequential: one job at a time, N_SEQ times through the compiled wrapper, each alternated with one through
        # the Python wrapper (the order swapping every pair), so that other load falls on both alike.
        seq: dict[str, list] = {"setup": [], "starter": [], "gone": []}
        py_seq: list[float] = []
        e2e_by_job: dict[int, float] = {}
        fails = py_fails = 0
        for i in range(N_SEQ):
            for compiled in ((True, False) if i % 2 == 0 else (False, True)):
                if compiled:
                    got = lark_batch(host, stamp, wrapper, 1, 1000 + i)
                    if got["setup"]:
                        e2e_by_job[1000 + i] = got["setup"][0]
                    for k in seq:
                        seq[k] += got[k]
                    fails += got["failures"]
                else:
                    got = lark_batch(host, stamp, py_wrapper, 1, PY_FIRST + i)
                    py_seq += got["setup"]
                    py_fails += got["failures"]
        rows.append(("lark, sequential", len(seq["setup"]), fails, seq["setup"]))
        inside_by_job = larkd_setup_by_job(host, 1000, N_SEQ)
        inside = list(inside_by_job.values())
        rows.append(("  of which larkd JobNetworker.setup (its log)", len(inside), 0, inside))
        # Per job, what is not larkd's setup: the wrapper's start and connect, larkd's accept, peer checks, plan and
        # pin, the hops to and from its setup thread, the answer, the wrapper's exec of the program.
        outside = [e2e_by_job[j] - inside_by_job[j] for j in e2e_by_job if j in inside_by_job]
        rows.append(("  the rest, per job (e2e - its JobNetworker.setup)", len(outside), 0, outside))
        rows.append(("lark teardown: the starter waits", len(seq["starter"]), 0, seq["starter"]))
        rows.append(("lark teardown: netns+veth gone after exit", len(seq["gone"]), 0, seq["gone"]))
        rows.append(("python wrapper, sequential (comparison, no goal)", len(py_seq), py_fails, py_seq))
        inside = larkd_setup_ms(host, PY_FIRST, N_SEQ)
        rows.append(("  of which larkd JobNetworker.setup (its log)", len(inside), 0, inside))
        starts = wrapper_start_ms(host, stamp, N_SEQ)
        rows.append(("  of which the wrapper's python start + imports", len(starts), 0, starts))
        cni = cni_run(host, stamp, N_SEQ, 1)
        rows.append(("cni chain ADD+exec, sequential", len(cni["setup"]), cni["failures"], cni["setup"]))
        rows.append(("cni chain DEL (the runtime waits)", len(cni["del"]), 0, cni["del"]))
        summary.update(e2e_p50_ms=statistics.median(seq["setup"]), e2e_p99_ms=pct(seq["setup"], 99),
                       cni_p50_ms=statistics.median(cni["setup"]), py_e2e_p50_ms=statistics.median(py_seq))
        rates = []
        for c in CONCURRENCY:
            got = lark_batch(host, stamp, wrapper, c, 2000 + 1000 * c)
            rates.append(got["rate"])
            rows.append((f"lark, {c} concurrent", len(got["setup"]), got["failures"], got["setup"]))
            inside = larkd_setup_ms(host, 2000 + 1000 * c, c)
            rows.append((f"  of which larkd JobNetworker.setup, {c} at once", len(inside), 0, inside))
            rows.append((f"lark teardown, {c} concurrent: the starter waits", len(got["starter"]), 0,
                         got["starter"]))
            rows.append((f"lark teardown, {c} concurrent: gone after exit", len(got["gone"]), 0, got["gone"]))
            if c == 64:
                summary.update(c64_p99_ms=pct(got["setup"], 99), c64_failures=got["failures"])
            cni = cni_run(host, stamp, c, c)
            rows.append((f"cni chain, {c} concurrent", len(cni["setup"]), cni["failures"], cni["setup"]))
            rows.append((f"cni chain DEL, {c} concurrent", len(cni["del"]), 0, cni["del"]))
        summary["setups_per_s"] = max(rates) if rates else 0.0
        # Background teardown must leave nothing: namespaces, veths, firewall objects, address locks, records.
        leaked = {k: v for k, v in host.wait_clean(timeout=30).items() if v}
        summary["fallbacks"] = fallbacks(tmp)
    finally:
        host.close()
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.rmtree(host_dir, ignore_errors=True)
    print(f"{'measurement':<52} {'n':>4} {'fail':>4} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8}")
    for name, n, fails, xs in rows:
        if xs:
            print(f"{name:<52} {n:>4} {fails:>4} {statistics.median(xs):>8.1f} {pct(xs, 99):>8.1f} {max(xs):>8.1f}")
        else:
            print(f"{name:<52} {n:>4} {fails:>4} {'-':>8} {'-':>8} {'-':>8}")
    print(f"left behind after every job ended: {leaked or 'nothing'}")
    print(f"compiled wrapper fell back to the python wrapper: {summary['fallbacks']:.0f} jobs")
    speedup = summary["cni_p50_ms"] / summary["e2e_p50_ms"]
    goal_list = issue27_goals(summary, speedup)
    print()
    print(goals.table(goal_list, "issue 27 goals, fake execution point"))
    print()
    print(f"e2e_p50_ms={summary['e2e_p50_ms']:.1f} e2e_p99_ms={summary['e2e_p99_ms']:.1f} "
          f"cni_p50_ms={summary['cni_p50_ms']:.1f} speedup={speedup:.2f} "
          f"c64_p99_ms={summary.get('c64_p99_ms', float('nan')):.1f} c64_failures={summary.get('c64_failures', -1)} "
          f"setups_per_s={summary['setups_per_s']:.0f} py_e2e_p50_ms={summary['py_e2e_p50_ms']:.1f} "
          f"fallbacks={summary['fallbacks']:.0f} {goals.fields(goal_list)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
