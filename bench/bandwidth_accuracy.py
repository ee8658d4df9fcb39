"""How exactly Lark's limits hold: iperf3 goodput / configured limit, per attach mode, limit and direction.

Runs on a fake execution point (tests/helpers/fakehost.py: host and world namespaces made here, larkd with its
real config, jobs started through a stand-in starter into empty namespaces, iperf3 server in the world). For
each limit the slot ad carries `Bandwidth = <limit>`, exactly as the startd reports an allocation. TCP
goodput over Ethernet can reach at most 1448/1514 = 0.956 of the link-level rate, so 0.956 is a perfect
shaper; the goal is 0.93-0.97 everywhere. Prints a table, then the worst and best ratio.

Then a reservation under contention (NAT): a 400 Mbit/s link (tbf on the world side), three jobs without a
reservation saturating it, one job with `Bandwidth = 300`: the reserved job's goodput / 300, same goal. This was
tests/integration/test_security_kernel.py's 0.95 of the reservation, which a loaded 2-core CI machine can miss; the
test now asks only that the reservation is not starved. BENCH_ONLY=reservation runs only this part.
"""
from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))
from helpers.fakehost import WORLD_IP, FakeHost, build_starter  # noqa: E402
from helpers.waits import wait_ready  # noqa: E402

LIMITS = [int(x) for x in os.environ.get("BENCH_LIMITS", "10,100,500,1000").split(",")]
SECONDS = os.environ.get("BENCH_SECONDS", "5")
log = logging.getLogger("bench")


def open_dir(prefix: str) -> str:
    d = tempfile.mkdtemp(prefix=prefix, dir="/tmp")
    os.chmod(d, 0o755)  # job processes run as nobody
    return d


def modes() -> dict[str, dict]:
    """Each attach mode this machine has, as a fake-host configuration (bridged ones take the uplink)."""
    bridged = dict(bridge_uplink="up0", bridge_range="198.51.100.100-198.51.100.149", bridge_gateway=WORLD_IP)
    out = {"nat": {}, "bridge": dict(default_network_type="bridge", **bridged)}
    if shutil.which("ovs-vswitchd"):
        out["ovs_bridge"] = dict(ovs=True, default_network_type="ovs_bridge", ovs_uplink="up0",
                                 ovs_datapath="netdev", **bridged)
    return out


def measure(host: FakeHost, slot: str, limit: int, direction: str, n: int) -> float | None:
    job_ad = f"ClusterId = {n}\nProcId = 0"
    host.publish_ad(slot, job_ad, f"Bandwidth = {limit}")
    cp = host.run_job(slot, ["iperf3", WORLD_IP, "5201", SECONDS, direction], job_ad=job_ad,
                      timeout=float(SECONDS) + 60)
    if cp.returncode != 0:
        log.error("job failed: %s", cp.stderr.strip()[-500:])
        return None
    r = json.loads(cp.stdout)
    if not r.get("bps"):
        log.error("iperf3 failed: %s", r.get("error"))
        return None
    return r["bps"]


def reservation(starter: str, link: int = 400, reserved: int = 300) -> float | None:
    """The reserved job's iperf3 download goodput (bit/s) while three unreserved jobs saturate the link."""
    host = FakeHost(open_dir("lark-bwhost-"), starter).start()
    try:
        subprocess.run(host.in_world(["tc", "qdisc", "replace", "dev", "w0", "root", "tbf", "rate", f"{link}mbit",
                                      "burst", "256kb", "latency", "50ms"]), check=True)
        for port in range(5211, 5215):
            host.procs.append(subprocess.Popen(host.in_world(["iperf3", "-s", "-p", str(port)]),
                                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        hogs = []
        for i in range(3):
            ad = f"ClusterId = {300 + i}\nProcId = 0"
            host.publish_ad(f"hog{i}", ad, f"Bandwidth = 0\nTotalBandwidth = {link}")
            hogs.append(host.spawn_job(f"hog{i}", ["iperf3", WORLD_IP, str(5211 + i), str(int(SECONDS) + 6), "down"],
                                       job_ad=ad))
        for i in range(3):
            wait_ready(host, f"hog{i}")
        time.sleep(1.0)                       # the hogs' TCP out of slow start: the link is full
        ad = "ClusterId = 310\nProcId = 0"
        host.publish_ad("reserved", ad, f"Bandwidth = {reserved}\nTotalBandwidth = {link}")
        cp = host.run_job("reserved", ["iperf3", WORLD_IP, "5214", SECONDS, "down"], job_ad=ad,
                          timeout=float(SECONDS) + 60)
        for h in hogs:
            h.communicate(timeout=float(SECONDS) + 60)
        r = json.loads(cp.stdout) if cp.returncode == 0 else {}
        if not r.get("bps"):
            log.error("reserved job failed: %s %s", cp.stderr.strip()[-300:], r.get("error"))
            return None
        return r["bps"]
    finally:
        host.close()


def main() -> int:
    logging.basicConfig(level=logging.INFO, format="bench: %(message)s")
    if os.geteuid() != 0 or not shutil.which("iperf3"):
        log.error("run as root with iperf3 installed (make bench does both)")
        return 2
    tmp = open_dir("lark-bwbench-")
    starter = build_starter(tmp)
    rows = []
    n = 100
    for mode, cfg in ({} if os.environ.get("BENCH_ONLY") == "reservation" else modes()).items():
        host = FakeHost(open_dir("lark-bwhost-"), starter, **cfg).start()
        try:
            iperf = subprocess.Popen(host.in_world(["iperf3", "-s", "-p", "5201"]), stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL)
            host.procs.append(iperf)
            for limit in LIMITS:
                for direction in ("down", "up"):
                    n += 1
                    bps = measure(host, f"slot{n}", limit, direction, n)
                    rows.append((mode, limit, direction, bps))
                    log.info("%-10s %5d Mbit/s %-4s -> %s", mode, limit, direction,
                             f"{bps / 1e6:.1f} Mbit/s" if bps else "failed")
        finally:
            host.close()
    reserved_bps = reservation(starter)
    shutil.rmtree(tmp, ignore_errors=True)
    if reserved_bps:
        rows.append(("nat+3 hogs", 300, "down", reserved_bps))

    print(f"\n{'mode':<10} {'limit Mbit/s':>12} {'direction':<10} {'goodput Mbit/s':>15} {'ratio':>7}")
    ratios = []
    for mode, limit, direction, bps in rows:
        ratio = bps / (limit * 1e6) if bps else None
        if ratio:
            ratios.append(ratio)
        label = "toward job" if direction == "down" else "from job"
        print(f"{mode:<10} {limit:>12} {label:<10} {bps / 1e6 if bps else float('nan'):>15.1f} "
              f"{ratio if ratio else float('nan'):>7.3f}")
    if not ratios:
        print("no measurement succeeded")
        return 1
    ok = all(0.93 <= r <= 0.97 for r in ratios)
    # Worst and best measured against the ideal 0.956, not against 1.0.
    worst = max(ratios, key=lambda r: abs(r - 0.956))
    best = min(ratios, key=lambda r: abs(r - 0.956))
    print(f"worst_ratio={worst:.3f} best_ratio={best:.3f} range={min(ratios):.3f}-{max(ratios):.3f} "
          f"goal=0.93-0.97 {'met' if ok else 'NOT met'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
