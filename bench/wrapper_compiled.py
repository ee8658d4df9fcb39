"""Issue 27's first lever, measured: the compiled wrapper's fast path (lark/job/launcher/job_wrapper.c) against the
Python wrapper (lark/job/wrapper.py), alternated job by job in one run on one larkd on the fake execution point.

Each job is what bench/e2e_latency.py runs: the test starter (tests/helpers/test_starter.c) clones it into an
empty netns as uid 65534 and execs `stamp env LARK_SOCKET=.. PYTHONPATH=.. WRAPPER stamp`; the first stamp marks
the wrapper's exec, the second the job's program running in its network (NAT, static address, limits both ways).
"python" is lark-job-wrapper as pip installs it (a console script on the job's Python); "compiled" is the C
program built here with that script as its fallback. The fake execution point has no schedd, so larkd announces
no exit barrier and both take their common path (the compiled one never falls back here: its fallback is counted).

Sequential: BENCH_N pairs (default 50; --quick 10), the pair's order alternating (python first, then compiled
first), so that the other helpers' load on this shared machine falls on both alike. Then BENCH_ROUNDS rounds
(default 2) of one 16-at-once batch of each, in the order A B, B A. Figures: wrapper exec -> job's program
(p50/p99), larkd's own setup time per job (its log), and the job side's CPU per job: user+system time of the
starter and its job (os.wait4's rusage: the wrapper, the two stamps and env; the starter is the same for both),
and larkd's CPU per sequential job (/proc, clock ticks summed over the jobs of each kind).

The exit barrier (the path every job takes on a pool, where larkd announces one): the fake execution point has no
schedd, so its larkd announces none; this part runs each wrapper against a stand-in larkd on a Unix socket (a
thread of this process, the same for both) that announces exit_barrier 60 and answers the push at once, so it
measures the wrapper's own share: BENCH_BARRIER_N jobs each (default 50; --quick 10), alternated, the job's program
a stamp. Figures: wrapper exec -> program (setup), program -> wrapper's exit seen here (the barrier: fork, wait,
push, exit), and the job side's CPU (wrapper and stamps, os.wait4).

Prints a table, the load average before and after, then one line:
py_p50_ms=<> py_p99_ms=<> c_p50_ms=<> c_p99_ms=<> saved_p50_ms=<> py_c16_p99_ms=<> c_c16_p99_ms=<>
py_cpu_ms=<> c_cpu_ms=<> larkd_cpu_ms=<> py_barrier_p50_ms=<> c_barrier_p50_ms=<> py_barrier_cpu_ms=<>
c_barrier_cpu_ms=<> load1=<> fallbacks=<n>
"""
from __future__ import annotations

import os
import shutil
import socketserver
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import ExitStack
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
# e2e_latency puts the repository and tests/ on sys.path too (helpers.fakehost, lark).
from e2e_latency import (
    LIMIT_MBIT,
    REPO,
    build_compiled,
    build_stamp,
    counted_fallback,
    fallbacks,
    larkd_setup_ms,
    pct,
    stamps,
    write_launcher,
)

QUICK = "--quick" in sys.argv[1:]
N_SEQ = int(os.environ.get("BENCH_N", "10" if QUICK else "50"))
ROUNDS = int(os.environ.get("BENCH_ROUNDS", "1" if QUICK else "2"))
BATCH = 16
N_BARRIER = int(os.environ.get("BENCH_BARRIER_N", "10" if QUICK else "50"))
TICK_MS = 1000 / os.sysconf("SC_CLK_TCK")


def cpu_ticks(pid: int) -> int:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15 of proc(5))


def batch(host, stamp: Path, wrapper: Path, first: int, n: int) -> dict:
    """n jobs at once through `wrapper`: per job "setup" (ms, wrapper exec -> program), "cpu" (ms of the starter
    and its job, user+system); "failures"."""
    slots = [f"w{first + i}" for i in range(n)]
    for i, slot in enumerate(slots):
        host.publish_ad(slot, f"ClusterId = {first + i}\nProcId = 0", f"Bandwidth = {LIMIT_MBIT}")
    launch = ["env", f"LARK_SOCKET={host.cfg.socket}", f"PYTHONPATH={REPO}", str(wrapper)]
    waited: list[tuple[int, float]] = [(0, 0.0)] * n
    texts: list[str] = []
    with ExitStack() as stack:
        outs = [stack.enter_context(tempfile.TemporaryFile(mode="w+")) for _ in slots]
        procs = [subprocess.Popen(host.in_host([host.starter, "-a", slot, "-u", "65534", "--", str(stamp), *launch,
                                                str(stamp)]), stdout=out, stderr=subprocess.STDOUT)
                 for slot, out in zip(slots, outs, strict=True)]

        def reap(i: int) -> None:  # wait4: the starter's rusage includes its job's (the starter reaps it)
            _, status, ru = os.wait4(procs[i].pid, 0)
            procs[i].returncode = os.waitstatus_to_exitcode(status)
            waited[i] = (procs[i].returncode, (ru.ru_utime + ru.ru_stime) * 1000)
        threads = [threading.Thread(target=reap, args=(i,)) for i in range(n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(300)
        for out in outs:
            out.seek(0)
            texts.append(out.read())
    setup, cpu, failures = [], [], 0
    for slot, text, (rc, cpu_ms) in zip(slots, texts, waited, strict=True):
        st = stamps(text)
        if rc == 0 and len(st) == 2:
            setup.append((st[1] - st[0]) / 1e6)
            cpu.append(cpu_ms)
        else:
            failures += 1
            sys.stderr.write(f"job on {slot} through {wrapper.name} failed ({rc}): {text.strip()[-300:]}\n")
    return {"setup": setup, "cpu": cpu, "failures": failures}


def stand_in_larkd(path: Path) -> socketserver.UnixStreamServer:
    """Answers setup with an exit barrier of 60 s and a push with pushed=True, one connection at a time."""
    from lark import protocol
    answers = {"setup": protocol.ok(plan={}, env={"LARK_NETWORK_TYPE": "nat"}, exit_barrier=60.0),
               "push": protocol.ok(pushed=True)}

    class Answer(socketserver.StreamRequestHandler):
        def handle(self) -> None:
            msg = protocol.parse_request(self.rfile.readline())
            self.wfile.write(answers[str(msg["op"])])

    srv = socketserver.UnixStreamServer(str(path), Answer)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv


def barrier_runs(tmp: Path, stamp: Path, wrappers: dict[str, Path]) -> dict[str, dict[str, list[float]]]:
    """Per wrapper: "setup" and "barrier" ms (see the module's doc), "cpu" ms, "failures" (as a one-item list)."""
    sock = tmp / "stand-in.sock"
    srv = stand_in_larkd(sock)
    got: dict[str, dict[str, list[float]]] = {k: {"setup": [], "barrier": [], "cpu": [], "failures": [0]}
                                              for k in wrappers}
    env = {"PATH": os.environ["PATH"], "LARK_SOCKET": str(sock), "PYTHONPATH": str(REPO)}
    try:
        for i in range(N_BARRIER + 1):  # the first pair warms up
            for kind in (list(wrappers) if i % 2 == 0 else list(reversed(wrappers))):
                with tempfile.TemporaryFile(mode="w+") as out:
                    p = subprocess.Popen([str(stamp), str(wrappers[kind]), str(stamp)], env=env, stdout=out,
                                         stderr=subprocess.STDOUT)
                    _, status, ru = os.wait4(p.pid, 0)
                    t_exit = time.time_ns()
                    p.returncode = os.waitstatus_to_exitcode(status)
                    out.seek(0)
                    text = out.read()
                st = stamps(text)
                if p.returncode != 0 or len(st) != 2:
                    got[kind]["failures"][0] += 1
                    sys.stderr.write(f"barrier job through {wrappers[kind].name} failed ({p.returncode}): "
                                     f"{text.strip()[-300:]}\n")
                elif i:
                    got[kind]["setup"].append((st[1] - st[0]) / 1e6)
                    got[kind]["barrier"].append((t_exit - st[1]) / 1e6)
                    got[kind]["cpu"].append((ru.ru_utime + ru.ru_stime) * 1000)
    finally:
        srv.shutdown()
        srv.server_close()
    return got


def main() -> int:
    if os.geteuid() != 0:
        raise SystemExit("wrapper_compiled: run as root (it makes network namespaces)")
    from helpers.fakehost import FakeHost, build_starter
    load_before = os.getloadavg()
    tmp = Path(tempfile.mkdtemp(prefix="lark-bench-wrapc-"))
    tmp.chmod(0o755)  # the job (uid 65534) execs the binaries from here
    host = FakeHost(str(tmp / "host"), build_starter(str(tmp)))
    stamp = build_stamp(tmp)
    launcher = write_launcher(tmp)
    wrappers = {"python": launcher, "compiled": build_compiled(tmp, counted_fallback(tmp, launcher))}
    first_id = {"python": 10000, "compiled": 20000}
    seq: dict[str, dict[str, list[float]]] = {k: {"setup": [], "cpu": []} for k in wrappers}
    conc: dict[str, dict[str, list[float]]] = {k: {"setup": [], "cpu": []} for k in wrappers}
    larkd_ticks = {k: 0 for k in wrappers}
    fails = {k: 0 for k in wrappers}
    inside: dict[str, list[float]] = {}
    bar: dict[str, dict[str, list[float]]] = {k: {"setup": [], "barrier": [], "cpu": [], "failures": [0]}
                                              for k in wrappers}
    fell_back = 0
    leaked: dict = {}
    try:
        host.start()
        assert host.larkd is not None
        for kind in wrappers:  # one warm-up job each: page cache, larkd's first-use paths
            batch(host, stamp, wrappers[kind], first_id[kind] + 9000, 1)
        for i in range(N_SEQ):
            order = list(wrappers) if i % 2 == 0 else list(reversed(wrappers))
            for kind in order:
                t0 = cpu_ticks(host.larkd.pid)
                got = batch(host, stamp, wrappers[kind], first_id[kind] + i, 1)
                larkd_ticks[kind] += cpu_ticks(host.larkd.pid) - t0
                seq[kind]["setup"] += got["setup"]
                seq[kind]["cpu"] += got["cpu"]
                fails[kind] += got["failures"]
        for kind in wrappers:
            inside[kind] = larkd_setup_ms(host, first_id[kind], N_SEQ)
        for r in range(ROUNDS):
            order = list(wrappers) if r % 2 == 0 else list(reversed(wrappers))
            for kind in order:
                got = batch(host, stamp, wrappers[kind], first_id[kind] + 1000 + 100 * r, BATCH)
                conc[kind]["setup"] += got["setup"]
                conc[kind]["cpu"] += got["cpu"]
                fails[kind] += got["failures"]
        bar = barrier_runs(tmp, stamp, wrappers)
        for kind in wrappers:
            fails[kind] += int(bar[kind]["failures"][0])
        fell_back = fallbacks(tmp)
        leaked = {k: v for k, v in host.wait_clean(timeout=30).items() if v}
    finally:
        host.close()
        shutil.rmtree(tmp, ignore_errors=True)
    load_after = os.getloadavg()
    rows = []
    for kind in wrappers:
        rows.append((f"{kind}: wrapper exec -> job, sequential", len(seq[kind]["setup"]), fails[kind],
                     seq[kind]["setup"]))
        rows.append((f"{kind}:   of which larkd JobNetworker.setup", len(inside[kind]), 0, inside[kind]))
        rows.append((f"{kind}: wrapper exec -> job, {BATCH} at once x{ROUNDS}", len(conc[kind]["setup"]), 0,
                     conc[kind]["setup"]))
        rows.append((f"{kind}: job-side CPU ms (starter+job), sequential", len(seq[kind]["cpu"]), 0,
                     seq[kind]["cpu"]))
        rows.append((f"{kind}: job-side CPU ms, {BATCH} at once", len(conc[kind]["cpu"]), 0, conc[kind]["cpu"]))
    for kind in wrappers:
        rows.append((f"{kind}: barrier: wrapper exec -> job", len(bar[kind]["setup"]), int(bar[kind]["failures"][0]),
                     bar[kind]["setup"]))
        rows.append((f"{kind}: barrier: job -> wrapper's exit", len(bar[kind]["barrier"]), 0, bar[kind]["barrier"]))
        rows.append((f"{kind}: barrier: job-side CPU ms", len(bar[kind]["cpu"]), 0, bar[kind]["cpu"]))
    print(f"{'measurement (alternated, one larkd)':<52} {'n':>4} {'fail':>4} {'p50 ms':>8} {'p99 ms':>8} "
          f"{'max ms':>8}")
    for name, n, nfail, xs in rows:
        if xs:
            print(f"{name:<52} {n:>4} {nfail:>4} {statistics.median(xs):>8.1f} {pct(xs, 99):>8.1f} {max(xs):>8.1f}")
        else:
            print(f"{name:<52} {n:>4} {nfail:>4} {'-':>8} {'-':>8} {'-':>8}")
    larkd_cpu = {k: larkd_ticks[k] * TICK_MS / max(1, N_SEQ) for k in wrappers}
    print(f"larkd CPU per sequential job (clock ticks summed): python {larkd_cpu['python']:.1f} ms, "
          f"compiled {larkd_cpu['compiled']:.1f} ms")
    print(f"compiled path fell back to the python wrapper: {fell_back} jobs")
    print(f"load average before {load_before[0]:.2f} {load_before[1]:.2f} {load_before[2]:.2f}, "
          f"after {load_after[0]:.2f} {load_after[1]:.2f} {load_after[2]:.2f} ({os.cpu_count()} cpus)")
    print(f"left behind after every job ended: {leaked or 'nothing'}")
    py, c = seq["python"]["setup"], seq["compiled"]["setup"]
    med = statistics.median
    print()
    print(f"py_p50_ms={med(py):.1f} py_p99_ms={pct(py, 99):.1f} c_p50_ms={med(c):.1f} c_p99_ms={pct(c, 99):.1f} "
          f"saved_p50_ms={med(py) - med(c):.1f} py_c16_p99_ms={pct(conc['python']['setup'], 99):.1f} "
          f"c_c16_p99_ms={pct(conc['compiled']['setup'], 99):.1f} py_cpu_ms={med(seq['python']['cpu']):.1f} "
          f"c_cpu_ms={med(seq['compiled']['cpu']):.1f} larkd_cpu_ms={statistics.mean(larkd_cpu.values()):.1f} "
          f"py_barrier_p50_ms={med(bar['python']['barrier']):.1f} "
          f"c_barrier_p50_ms={med(bar['compiled']['barrier']):.1f} "
          f"py_barrier_cpu_ms={med(bar['python']['cpu']):.1f} c_barrier_cpu_ms={med(bar['compiled']['cpu']):.1f} "
          f"load1={(load_before[0] + load_after[0]) / 2:.2f} fallbacks={fell_back}")
    return 0 if not any(fails.values()) and fell_back == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
