"""Issue 27, the STARTER wrapper as a compiled program: lark-starter's start-to-exec, the Python one
(lark/job/starter_wrapper.py) against the compiled one (lark/job/launcher/starter.c), alternated in one run.

Each run is what the startd does at every job's start, with stand-ins: `stamp LARK_STARTER true -a slot1_1 <addr>`,
LARK_REAL_STARTER=stamp. The first stamp marks the wrapper's exec, the second the real starter's (here the stamp
program, which then execs `true`): the figure is the wrapper's whole share of a starter's start, its question to
larkd included. larkd is a stand-in: a thread of this process on a Unix socket that answers every `sandbox_limit`
with ok (limited), at once, so the figure holds no cgroup move (larkd's own cost: bench/sandbox_ask.py). "python" is
lark-starter as pip installs it (a console script on this venv's Python, PYTHONPATH this repository); "compiled" is
starter.c built here as `lark install-hook` builds it, with that script as its fallback (never taken here: counted).
Both get LARK_REAL_STARTER in their environment, so the Python one runs no `condor_config_val LARK_REAL_STARTER`
here (this host has no HTCondor): on an EP it also pays that, 8.12 ms in the testbed root, which the compiled one
never runs (it has the path from install-hook).

BENCH_N pairs (default 100; --quick 20), the pair's order alternating (python first, then compiled first) so that
the other load on this shared machine falls on both alike; one pair first to warm up, not counted. Figures: wrapper
exec -> real starter exec (p50/p90/p99) and the CPU of the whole run (user+system, os.wait4: the wrapper, its
children, the two stamps and true).

Prints a table, the load average before and after, then one line:
py_p50_ms=<> py_p99_ms=<> c_p50_ms=<> c_p99_ms=<> saved_p50_ms=<> speedup=<> py_cpu_ms=<> c_cpu_ms=<> load1=<>
failures=<n> fallbacks=<n>
"""
from __future__ import annotations

import os
import socketserver
import statistics
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from e2e_latency import REPO, build_stamp, pct, stamps  # also puts the repository on sys.path

from lark import hook_launcher, protocol

QUICK = "--quick" in sys.argv[1:]
N = int(os.environ.get("BENCH_N", "20" if QUICK else "100"))
ARGS = ["true", "-a", "slot1_1", "<127.0.0.1:9618?addrs=127.0.0.1-9618>"]


def stand_in_larkd(path: Path, op: str = "sandbox_limit",
                   answer: bytes = protocol.ok(limited=True, cgroup="/sys/fs/cgroup/unified/lark.sandbox/starter-1-1"),
                   ) -> tuple[socketserver.UnixStreamServer, list[int]]:
    """Answers each question with `answer`; counts those that are `op`."""
    asked = [0]

    class Answer(socketserver.StreamRequestHandler):
        def handle(self) -> None:
            msg = protocol.parse_request(self.rfile.readline())
            asked[0] += msg.get("op") == op
            self.wfile.write(answer)

    srv = socketserver.UnixStreamServer(str(path), Answer)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv, asked


def programs(tmp: Path) -> dict[str, Path]:
    py = tmp / "lark-starter"
    py.write_text(f"#!{sys.executable}\nimport sys\nfrom lark.job.starter_wrapper import main\n"
                  "if __name__ == '__main__':\n    sys.argv[0] = sys.argv[0].removesuffix('.exe')\n"
                  "    sys.exit(main())\n")
    py.chmod(0o755)
    marks = tmp / "fallbacks"
    marks.mkdir()
    counted = tmp / "lark-starter-counted"  # the compiled one's fallback: the Python one, after leaving a mark
    counted.write_text(f'#!/bin/sh\n: > {marks}/$$\nexec {py} "$@"\n')
    counted.chmod(0o755)
    c = tmp / "lark-starter-compiled"
    subprocess.run(["gcc", *hook_launcher.CFLAGS, f"-DLARK_PY_STARTER=\"{counted}\"",
                    f"-DLARK_REAL_STARTER_PATH=\"{tmp / 'stamp'}\"", "-o", str(c), str(hook_launcher.STARTER_SOURCE)],
                   check=True)
    return {"python": py, "compiled": c}


def one(stamp: Path, prog: Path, env: dict[str, str]) -> tuple[float | None, float, str]:
    """(wrapper exec -> real starter exec in ms, or None when it failed; CPU ms; its output)."""
    with tempfile.TemporaryFile(mode="w+") as out:
        p = subprocess.Popen([str(stamp), str(prog), *ARGS], env=env, stdout=out, stderr=subprocess.STDOUT)
        _, status, ru = os.wait4(p.pid, 0)
        out.seek(0)
        text = out.read()
    st = stamps(text)
    ok = os.waitstatus_to_exitcode(status) == 0 and len(st) == 2 and len(text.splitlines()) == 2
    return ((st[1] - st[0]) / 1e6 if ok else None), (ru.ru_utime + ru.ru_stime) * 1000, text


def alternate(progs: dict[str, Any], one: Callable[[Any], tuple[float | None, float, str]], n: int,
              what: str) -> tuple[dict[str, dict[str, list[float]]], int]:
    """`one(progs[kind])` for each kind, n + 1 rounds, the order alternating; the first round warms up, not
    counted. ({kind: {"ms": [...], "cpu": [...]}}, failures); each failure's output on stderr."""
    got: dict[str, dict[str, list[float]]] = {k: {"ms": [], "cpu": []} for k in progs}
    failures = 0
    for i in range(n + 1):
        for kind in (list(progs) if i % 2 == 0 else list(reversed(progs))):
            ms, cpu, text = one(progs[kind])
            if ms is None:
                failures += 1
                sys.stderr.write(f"{kind} {what} failed: {text.strip()[-300:]}\n")
            elif i:
                got[kind]["ms"].append(ms)
                got[kind]["cpu"].append(cpu)
    return got, failures


def report(got: dict[str, dict[str, list[float]]], column: str, load_before: float, failures: int,
           fallbacks: int) -> None:
    """The table (python and compiled), the load average, then the one key=value line."""
    load_after = os.getloadavg()[0]
    print(f"{column:10} {'n':>4} {'p50 ms':>8} {'p90 ms':>8} {'p99 ms':>8} {'max ms':>8} {'cpu p50 ms':>11}")
    for kind, g in got.items():
        print(f"{kind:10} {len(g['ms']):4d} {pct(g['ms'], 50):8.2f} {pct(g['ms'], 90):8.2f} {pct(g['ms'], 99):8.2f} "
              f"{max(g['ms'], default=float('nan')):8.2f} {statistics.median(g['cpu'] or [float('nan')]):11.2f}")
    print(f"load average (1 min): {load_before:.2f} before, {load_after:.2f} after")
    py, c = got["python"]["ms"], got["compiled"]["ms"]
    py50, c50 = pct(py, 50), pct(c, 50)
    print(f"py_p50_ms={py50:.2f} py_p99_ms={pct(py, 99):.2f} c_p50_ms={c50:.2f} c_p99_ms={pct(c, 99):.2f} "
          f"saved_p50_ms={py50 - c50:.2f} speedup={py50 / c50:.1f} "
          f"py_cpu_ms={statistics.median(got['python']['cpu'] or [float('nan')]):.2f} "
          f"c_cpu_ms={statistics.median(got['compiled']['cpu'] or [float('nan')]):.2f} load1={load_after:.2f} "
          f"failures={failures} fallbacks={fallbacks}")


def measure(tmp: Path, progs: dict[str, Any], op: str, env: dict[str, str],
            one: Callable[[Any], tuple[float | None, float, str]], what: str, title: str, column: str,
            load_before: float, answer: bytes | None = None) -> int:
    """The launcher benches' common run: a stand-in larkd on tmp/lark.sock answering `op` ok (`answer`:
    stand_in_larkd's default unless given), `progs` alternated (`one` times one run; `env` gets LARK_SOCKET), the
    title and report printed. Exit status 1 when a run failed, fell back to the Python twin (tmp/fallbacks), or
    larkd was not asked exactly once per run."""
    sock = tmp / "lark.sock"
    srv, asked = stand_in_larkd(sock, op) if answer is None else stand_in_larkd(sock, op, answer)
    env["LARK_SOCKET"] = str(sock)
    try:
        got, failures = alternate(progs, one, N, what)
    finally:
        srv.shutdown()
        srv.server_close()
    fallbacks = len(list((tmp / "fallbacks").iterdir()))
    runs = 2 * (N + 1)
    print(f"{title}, {N} alternated pairs (stand-in larkd answering {op} ok: {asked[0]} questions for {runs} runs)")
    report(got, column, load_before, failures, fallbacks)
    return 1 if failures or fallbacks or asked[0] != runs else 0


def main() -> int:
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="lark-bench-starter-") as d:
        tmp = Path(d)
        stamp = build_stamp(tmp)
        env = {"PATH": os.environ["PATH"], "LARK_REAL_STARTER": str(stamp), "PYTHONPATH": str(REPO)}
        return measure(tmp, programs(tmp), "sandbox_limit", env, lambda prog: one(stamp, prog, env),
                       "lark-starter", "lark-starter start -> real starter exec", "starter", load_before)


if __name__ == "__main__":
    sys.exit(main())
