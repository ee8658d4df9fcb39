"""Do a job's limits hold while it attacks them? Issue 14 item 1, measured.

On a fake execution point (tests/helpers/fakehost.py) with a slot allocated `Bandwidth = LIMIT`, a hostile job
(tests/helpers/hostile_job.py) tries each way out and then measures its upload and download with iperf3 against
the world namespace: ask larkd to release its network; ask for a network from a user+net namespace it made
(`unshare -Urn lark-job-wrapper`, where it would hold CAP_NET_ADMIN and delete its htb); delete its htb in the
namespace its starter gave it. Before the fix, the second attack uploaded at 24,842 Mbit/s under a 20 Mbit/s
limit. Goal: every attack refused, goodput/limit at most 0.97 both ways (0.956 is a perfect shaper). Prints a
table, then `worst_ratio=<largest goodput/limit>` and `escapes=<attacks that succeeded>`.
"""
from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "bench"))
from helpers.fakehost import HERE, WORLD_IP, FakeHost, build_starter, sh  # noqa: E402
from bandwidth_accuracy import open_dir  # noqa: E402  (a directory job processes, running as nobody, can read)

LIMIT = int(os.environ.get("BENCH_LIMIT", "20"))
SECONDS = os.environ.get("BENCH_SECONDS", "5")
log = logging.getLogger("bench")


def main() -> int:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    sdir = open_dir("lark-bench-starter-")
    host = None
    try:
        host = FakeHost(open_dir("lark-bench-host-"), build_starter(sdir)).start()
        iperf = subprocess.Popen(host.in_world(["iperf3", "-s", "-p", "5201"]), stdout=subprocess.DEVNULL,
                                 stderr=subprocess.DEVNULL)
        host.procs.append(iperf)  # ended by PID in host.close()
        time.sleep(0.5)
        ad = "ClusterId = 1\nProcId = 0"
        host.publish_ad("slot1", ad, f"Bandwidth = {LIMIT}")
        steps = ["release", "userns-setup", "tc-del", "iperf3", WORLD_IP, "5201", SECONDS, "up",
                 "iperf3", WORLD_IP, "5201", SECONDS, "down"]
        argv = host.job_argv("slot1", steps)
        argv[argv.index(str(HERE / "workload.py"))] = str(HERE / "hostile_job.py")
        cp = sh(argv, check=False, timeout=2 * float(SECONDS) + 120)
        if cp.returncode != 0:
            log.error("the hostile job failed: %s", cp.stderr[-500:])
            return 1
        r = [json.loads(line) for line in cp.stdout.splitlines() if line.startswith("{")]
        by = {x["step"]: x for x in r if x["step"] != "iperf3"}
        up, down = [x["bps"] for x in r if x["step"] == "iperf3"]
        escaped = {"release": bool(by["release"]["ok"]), "userns-setup": by["userns-setup"]["rc"] == 0,
                   "tc-del": by["tc-del"]["rc"] == 0}
        print(f"{'attack':<46} {'refused':<8}")
        for name, what in (("release", "release its own network"),
                           ("userns-setup", "network in a namespace it owns (unshare -Urn)"),
                           ("tc-del", "tc qdisc del dev eth0 root")):
            print(f"{what:<46} {'no' if escaped[name] else 'yes':<8}")
        print(f"\n{'direction':<10} {'limit Mbit/s':>12} {'goodput Mbit/s':>15} {'ratio':>7}")
        ratios = []
        for direction, bps in (("upload", up), ("download", down)):
            if not bps:
                log.error("iperf3 %s failed", direction)
                return 1
            ratios.append(bps / (LIMIT * 1e6))
            print(f"{direction:<10} {LIMIT:>12} {bps / 1e6:>15.2f} {ratios[-1]:>7.3f}")
        escapes = sum(escaped.values())
        held = max(ratios) <= 0.97   # a limit that holds reads <= 0.956 (TCP/IP header overhead), noise aside
        if escapes or not held:
            log.error("the job got out: %d attack(s) succeeded, worst goodput/limit %.3f (goal <= 0.97)",
                      escapes, max(ratios))
        print(f"worst_ratio={max(ratios):.3f} escapes={escapes}")
        return 0 if escapes == 0 and held else 1
    finally:
        if host:
            host.close()
        shutil.rmtree(sdir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
