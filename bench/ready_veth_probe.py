"""Issue 27's second lever, "a per-slot pool of ready network namespaces and veth pairs", measured at its core: what
a job's setup would pay to take a veth pair made ahead of time, against making it as larkd does now.

HTCondor's starter clones the job into a fresh, empty network namespace (NO_JOB_NETWORKING); the job runs as its user
and cannot join a namespace larkd made (setns needs CAP_SYS_ADMIN over it). So a pair made ahead must have its job end
moved into the job's namespace at setup, where today larkd creates the pair with its peer already there
(lark/kernel/links.create_veth). This times, alternated pair by pair in namespaces made here (never the machine's
own): A, larkd's way (one RTM_NEWLINK with the peer in the job's netns); B, the pool's way (the pair made untimed
beforehand; timed: the job end moved into the job's netns). Each pair is deleted untimed.

Prints a table, then one line: create_p50_ms=... move_p50_ms=... saved_p50_ms=... (negative: the pool costs more).
Environment: BENCH_N (pairs each way, default 60).
"""
from __future__ import annotations

import os
import secrets
import statistics
import subprocess
import sys
import time

from pyroute2 import NetNS


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def main() -> int:
    if os.geteuid() != 0:
        print("needs root (it makes network namespaces)", file=sys.stderr)
        return 2
    n = int(os.environ.get("BENCH_N", "60"))
    tag = secrets.token_hex(3)
    host_ns, job_ns = f"lark-bench-host-{tag}", f"lark-bench-job-{tag}"
    for ns in (host_ns, job_ns):
        subprocess.run(["ip", "netns", "add", ns], check=True)
    create: list[float] = []
    move: list[float] = []
    try:
        host = NetNS(host_ns)
        job_fd = os.open(f"/run/netns/{job_ns}", os.O_RDONLY)
        job = NetNS(job_ns)
        try:
            for i in range(n):
                # A: larkd's way, the peer made in the job's netns.
                t0 = time.perf_counter()
                host.link("add", ifname=f"lkA{i}", kind="veth", peer={"ifname": "eth0", "net_ns_fd": job_fd})
                create.append((time.perf_counter() - t0) * 1000)
                host.link("del", ifname=f"lkA{i}")
                # B: the pool's way, a pair made ahead (untimed), its job end moved in at setup.
                host.link("add", ifname=f"lkB{i}", kind="veth", peer={"ifname": f"jB{i}"})
                idx = host.link_lookup(ifname=f"jB{i}")[0]
                t0 = time.perf_counter()
                host.link("set", index=idx, net_ns_fd=job_fd)
                move.append((time.perf_counter() - t0) * 1000)
                host.link("del", ifname=f"lkB{i}")
                left = job.link_lookup(ifname=f"jB{i}")
                if left:   # deleting the host end takes the peer along; a kernel that does not, here it goes
                    job.link("del", index=left[0])
        finally:
            os.close(job_fd)
            host.close()
            job.close()
    finally:
        for ns in (host_ns, job_ns):
            subprocess.run(["ip", "netns", "del", ns], check=False)
    load = os.getloadavg()[0]
    print(f"{'per pair, ms (' + str(n) + ' each, alternated)':44}{'p50':>8}{'p90':>8}{'mean':>8}")
    for name, xs in (("A: create with the peer in the job's netns", create),
                     ("B: move a ready pair's end into it", move)):
        print(f"{name:44}{pct(xs, 0.5):8.2f}{pct(xs, 0.9):8.2f}{statistics.mean(xs):8.2f}")
    print(f"load average {load:.2f}")
    print(f"create_p50_ms={pct(create, 0.5):.2f} move_p50_ms={pct(move, 0.5):.2f} "
          f"saved_p50_ms={pct(create, 0.5) - pct(move, 0.5):.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
