"""What LARK_SANDBOX_LIMIT adds to each starter's start (issue 27 counts starter latency): lark-starter's
`sandbox_limit` question to a real larkd on the fake execution point (its own netns, socket and nft table), from a
fresh process each time, as a starter would ask it: larkd makes the process's cgroup, moves it there, opens a pidfd
and answers; the policers follow in larkd's background (not waited for). Each asker then exits and larkd removes
its cgroup and policers.

Also, for scale, the whole lark-starter process (python start, the ask, exec of /bin/true as the "real starter")
with the knob on and with LARK_SANDBOX_LIMIT=false in its environment (no question), alternated.

Environment: BENCH_N (askers, default 40). Prints a table, then one line:
ask_p50_ms=<x> ask_p90_ms=<y> starter_on_p50_ms=<a> starter_off_p50_ms=<b> added_p50_ms=<a-b> leftover_cgroups=<n>
"""
from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO))

from helpers.fakehost import FakeHost, build_starter  # noqa: E402

from lark.daemon.sandbox import SandboxLimiter  # noqa: E402

ASK = ("import time; t0 = time.perf_counter(); from lark.job import starter_wrapper as w; t = time.perf_counter(); "
       "a = w.ask_sandbox_limit(['-f', '-a', 'slot1_1']); "
       "print(round((time.perf_counter() - t) * 1000, 3), bool(a and a.get('limited')))")


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def main() -> int:
    n = int(os.environ.get("BENCH_N", "40"))
    with tempfile.TemporaryDirectory(prefix="lark-bench-sbx-") as tmp:
        host = FakeHost(tmp, build_starter(tmp), sandbox_cgroup=f"lark.sandbox.bench-{os.getpid()}")
        try:
            host.start()
            host.publish_ad("slot1_1", "ClusterId = 1\nProcId = 0", "Bandwidth = 20\n")
            env = dict(os.environ, LARK_SOCKET=host.cfg.socket, LARK_REAL_STARTER="/bin/true", PYTHONPATH=str(REPO))
            asks, limited = [], 0
            for _ in range(n):
                cp = subprocess.run(host.in_host([sys.executable, "-c", ASK]), capture_output=True, text=True,
                                    env=env, check=True)
                ms, ok = cp.stdout.split()
                asks.append(float(ms))
                limited += ok == "True"
            whole: dict[str, list[float]] = {"on": [], "off": []}
            for i in range(2 * n):
                mode = "on" if i % 2 == 0 else "off"
                e = dict(env, LARK_SANDBOX_LIMIT="true" if mode == "on" else "false")
                t = time.perf_counter()
                subprocess.run(host.in_host([sys.executable, "-m", "lark.job.starter_wrapper", "-f", "-a", "slot1_1"]),
                               env=e, check=True, capture_output=True)
                whole[mode].append((time.perf_counter() - t) * 1000)
            deadline = time.time() + 20
            lim = SandboxLimiter(host.cfg)
            while lim._cgroups() and time.time() < deadline:   # larkd removes them as the askers exit
                time.sleep(0.2)
            leftover = len(lim._cgroups())
        finally:
            host.close()
            with_parent = SandboxLimiter(host.cfg)
            if with_parent.cg2 and os.path.isdir(with_parent.parent):
                for s in with_parent._cgroups():
                    with_parent.remove(s)
                os.rmdir(with_parent.parent)
    print(f"{'what':<44} {'n':>4} {'p50 ms':>8} {'p90 ms':>8} {'max ms':>8}")
    rows = [("sandbox_limit ask (fresh process)", asks), ("lark-starter, knob on (ask + exec)", whole["on"]),
            ("lark-starter, LARK_SANDBOX_LIMIT=false", whole["off"])]
    for name, xs in rows:
        print(f"{name:<44} {len(xs):>4} {statistics.median(xs):>8.2f} {pct(xs, 0.9):>8.2f} {max(xs):>8.2f}")
    print(f"askers limited: {limited}/{n}")
    on, off = statistics.median(whole["on"]), statistics.median(whole["off"])
    print(f"ask_p50_ms={statistics.median(asks):.2f} ask_p90_ms={pct(asks, 0.9):.2f} starter_on_p50_ms={on:.1f} "
          f"starter_off_p50_ms={off:.1f} added_p50_ms={on - off:.1f} leftover_cgroups={leftover}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
