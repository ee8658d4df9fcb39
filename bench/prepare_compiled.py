"""Issue 27, the PREPARE_JOB hook's common path compiled: the hook's start to its exit, the Python hook
(lark/job/prepare_hook.py, `python -I script` as the setgid launcher used to exec it for every job) against the
compiled one (lark/job/launcher/prepare_job.c, which asks larkd's check itself), alternated in one run.

Each run is what the starter does at every job's start: the hook started with the job ad (about 3 kB) on its stdin,
read to EOF, larkd asked `check`, nothing printed, exit 0. larkd is a stand-in: a thread of this process on a Unix
socket that answers every `check` with ok, at once (larkd's own cost is not in the figure). "python" is the Python
hook as the old launcher ran it, minus the launcher's own exec (well under 1 ms); "compiled" is prepare_job.c
built here as `lark install-hook` builds it and made setgid to a gid no group has (as root; it refuses to run
without), with a counting stand-in for its interpreter, so that a fallback to the Python hook is seen (none
expected: counted).

BENCH_N pairs (default 100; --quick 20), the pair's order alternating so that the other load on this shared machine
falls on both alike; one pair first to warm up, not counted. Figures: spawn -> exit as the parent sees it
(p50/p90/p99) and the CPU of the hook (user+system, os.wait4).

Output as bench/starter_compiled.py's (its report(): the table, the load average, then the key=value line with
py_p50_ms, c_p50_ms, saved_p50_ms, speedup, failures and fallbacks).
"""
from __future__ import annotations

import grp
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from e2e_latency import REPO  # also puts the repository on sys.path
from starter_compiled import measure

from lark import hook_launcher, protocol

AD = "".join(f'Attr{i} = "value of attribute {i} of the job ad, as the starter writes it"\n' for i in range(40))


def programs(tmp: Path) -> dict[str, list[str]]:
    tmp.chmod(0o755)
    script = tmp / "hook.py"
    script.write_text(f"import sys\nsys.path.insert(0, {str(REPO)!r})\nfrom lark.job.prepare_hook import main\n"
                      "sys.exit(main())\n")
    marks = tmp / "fallbacks"
    marks.mkdir()
    counted = tmp / "python-counted"  # the compiled hook's interpreter: the real one, after leaving a mark
    counted.write_text(f'#!/bin/sh\n: > {marks}/$$\nexec {sys.executable} "$@"\n')
    counted.chmod(0o755)
    c = tmp / "lark-prepare-job"
    subprocess.run(["gcc", *hook_launcher.CFLAGS, f"-DLARK_HOOK_PYTHON=\"{counted}\"",
                    f"-DLARK_HOOK_SCRIPT=\"{script}\"", "-o", str(c), str(hook_launcher.SOURCE)], check=True)
    taken = {g.gr_gid for g in grp.getgrall()}
    os.chown(c, 0, next(gid for gid in range(60999, 1000, -1) if gid not in taken))
    os.chmod(c, 0o2755)
    return {"python": [sys.executable, "-I", str(script)], "compiled": [str(c)]}


def one(argv: list[str], env: dict[str, str]) -> tuple[float | None, float, str]:
    """(spawn -> exit in ms, or None when it failed; CPU ms; its output)."""
    r, w = os.pipe()
    os.write(w, AD.encode())  # fits the pipe: the hook reads it to EOF
    os.close(w)
    with tempfile.TemporaryFile(mode="w+") as out:
        t0 = time.perf_counter()
        p = subprocess.Popen(argv, env=env, stdin=r, stdout=out, stderr=subprocess.STDOUT)
        _, status, ru = os.wait4(p.pid, 0)
        ms = (time.perf_counter() - t0) * 1000
        os.close(r)
        out.seek(0)
        text = out.read()
    ok = os.waitstatus_to_exitcode(status) == 0 and text == ""
    return (ms if ok else None), (ru.ru_utime + ru.ru_stime) * 1000, text


def main() -> int:
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="lark-bench-prepare-") as d:
        tmp = Path(d)
        env = {"PATH": os.environ["PATH"], "LARK_CONFIG": str(tmp / "no-lark.toml")}
        return measure(tmp, programs(tmp), "check", env, lambda argv: one(argv, env), "PREPARE_JOB hook",
                       "PREPARE_JOB hook spawn -> exit", "hook", load_before, protocol.ok())


if __name__ == "__main__":
    sys.exit(main())
