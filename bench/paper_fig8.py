"""The paper's host-level bandwidth experiment (section VII-A, Figure 8) on the HTCondor testbed.

Three users' jobs download from three world servers at the same time through one 1 Gbit/s uplink (a tbf on
the world side of the testbed's uplink stands in for a 1 GbE NIC; the slot inventory says Bandwidth = 1000).
Run 1, managed: the jobs carry request_bandwidth = 100, 300, 600 and Lark limits each to its allocation.
Run 2, unmanaged: the same jobs without a request, so TCP splits the link when larkd runs with
default_bandwidth = "unlimited"; with "fair" (the default since issue 14) Lark gives each an equal share instead.
Each job samples its own received bytes; the per-second rates are plotted to a PNG like Figure 8 and summed
up in a table. Goal: managed jobs within +-5% of their limit; unmanaged ones near an equal split.
The jobs use file transfer (the sampler script is sent; its output comes back at the end). A job that started more
than once or was evicted (its event log) would have sampled twice: the bench then prints no figures and exits 1.
"""
from __future__ import annotations

import json
import logging
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "testbed"))
import eventlog  # noqa: E402
import testbed  # noqa: E402

log = logging.getLogger("fig8")
SECONDS = float(os.environ.get("BENCH_SECONDS", "20"))
LINK_MBIT = 1000
USERS = [("alice", 100, 8001), ("bob", 300, 8002), ("carol", 600, 8003)]
CONF = testbed.ROOT / "etc/condor/config.d/95-fig8.conf"
OUT = REPO / "bench" / "out"
RESTARTED: list[str] = []   # jobs whose event log shows other than exactly one start (run_once)

# Runs inside each job: wait for the common start time, download in a loop, sample the received bytes.
SAMPLER = """import json, sys, time, urllib.request
url, start_at, seconds = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
time.sleep(max(0.0, start_at - time.time()))
end, n, samples, last = start_at + seconds, 0, [], 0.0
while time.time() < end:
    with urllib.request.urlopen(url, timeout=30) as r:
        while time.time() < end:
            chunk = r.read(1 << 16)
            if not chunk:
                break
            n += len(chunk)
            now = time.time()
            if now - last >= 0.25:
                samples.append((now, n))
                last = now
print(json.dumps({"samples": samples}))
"""


def submit(user: str, port: int, request: int | None, start_at: float, run: str) -> int:
    name = f"fig8-{run}-{user}"
    d = testbed.ROOT / "home" / user / name
    d.mkdir(parents=True, exist_ok=True)
    (d / "sampler.py").write_text(SAMPLER)
    url = f"http://{testbed.WORLD_IP}:{port}/50M.bin"
    extra = f"request_bandwidth = {request}" if request else ""
    return testbed.submit_as(user, name, f'executable = /usr/bin/python3\ntransfer_executable = false\n'
                             f'arguments = "sampler.py {url} {start_at} {SECONDS}"\n'
                             "output = out.txt\nerror = err.txt\nlog = log.txt\n"
                             "should_transfer_files = YES\nwhen_to_transfer_output = ON_EXIT\n"
                             f"transfer_input_files = sampler.py\n{extra}\nqueue\n")


def wait_done(clusters: list[int], timeout: float) -> dict[int, dict]:
    rows: dict[int, dict] = {}
    deadline = time.time() + timeout
    attrs = ["Owner", "ExitCode", "LarkBandwidthLimit", "NetworkIncomingAvgRate", "NetworkIncomingBytes"]
    while time.time() < deadline and len(rows) < len(clusters):
        for c in clusters:
            if c not in rows:
                cp = testbed.run(testbed.in_root(["condor_history", str(c), "-af:t", *attrs]), check=False)
                if cp.stdout.strip():
                    rows[c] = dict(zip(attrs, cp.stdout.strip().split("\t")))
        time.sleep(2)
    return rows


def per_second(samples: list[list[float]], t0: float) -> list[tuple[float, float]]:
    """(seconds since t0, Mbit/s over the preceding second), from cumulative byte samples."""
    out = []
    j = 0
    for i, (t, n) in enumerate(samples):
        while samples[j][0] < t - 1.0:
            j += 1
        if j < i:
            tj, nj = samples[j]
            out.append((t - t0, (n - nj) * 8 / (t - tj) / 1e6))
    return out


def run_once(run: str, managed: bool) -> dict:
    start_at = time.time() + 25  # every job's network is up and waiting by then
    clusters = {}
    for user, mbit, port in USERS:
        clusters[user] = submit(user, port, mbit if managed else None, start_at, run)
    rows = wait_done(list(clusters.values()), timeout=SECONDS + 180)
    result = {}
    for user, mbit, _ in USERS:
        c = clusters[user]
        d = testbed.ROOT / "home" / user / f"fig8-{run}-{user}"
        RESTARTED.extend(f"{run} {user}: {eventlog.describe(job, events)}"
                         for job, events in eventlog.not_once(d / "log.txt", [f"{c}.0"]).items())
        out = (d / "out.txt").read_text().strip() if (d / "out.txt").exists() else ""
        samples = json.loads(out)["samples"] if out else []
        series = per_second(samples, start_at)
        steady = [r for t, r in series if 2.0 <= t <= SECONDS - 1.0]  # skip slow start and the tail
        result[user] = {"request": mbit if managed else None, "series": series,
                        "mean": statistics.mean(steady) if steady else float("nan"),
                        "history": rows.get(c, {})}
    return result


def plot(results: dict[str, dict], path: Path) -> bool:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log.warning("matplotlib not installed: no PNG (make bench installs it)")
        return False
    fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    for ax, (run, res) in zip(axes, results.items()):
        for user, r in res.items():
            label = f"{user} ({r['request']} Mbit/s)" if r["request"] else user
            ax.plot([t for t, _ in r["series"]], [v for _, v in r["series"]], label=label)
        ax.set_title("with Lark bandwidth management" if run == "managed" else "without management")
        ax.set_xlabel("time (s)")
        ax.grid(alpha=0.3)
        ax.legend()
    axes[0].set_ylabel("download rate (Mbit/s)")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    return True


def main() -> int:
    logging.basicConfig(level=logging.INFO, format="fig8: %(message)s")
    testbed.prepare("fig8")
    CONF.write_text("# bench/paper_fig8.py: a 1 GbE execution point\nMACHINE_RESOURCE_INVENTORY_Bandwidth =\n"
                    f"MACHINE_RESOURCE_Bandwidth = {LINK_MBIT}\n")
    servers: list[subprocess.Popen] = []
    try:
        testbed.start()
        testbed.run(["ip", "netns", "exec", testbed.WORLD_NS, "tc", "qdisc", "replace", "dev", "w0", "root", "tbf",
                     "rate", f"{LINK_MBIT}mbit", "burst", "256kb", "latency", "50ms"])
        for _, _, port in USERS:
            servers.append(subprocess.Popen(
                ["nsenter", f"--net=/run/netns/{testbed.WORLD_NS}", sys.executable, "-m", "http.server", str(port),
                 "--directory", str(testbed.CACHE / "www")], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        results = {"managed": run_once("managed", True), "unmanaged": run_once("unmanaged", False)}
    finally:
        for p in servers:
            p.send_signal(signal.SIGTERM)
            p.wait(10)
        CONF.unlink(missing_ok=True)
        testbed.stop()

    if RESTARTED:
        print("\nfig8: no figures from this run: these jobs did not start exactly once (an evicted job samples "
              "again, or not at all):")
        for line in RESTARTED:
            print(f"  {line}")
        return 1
    png = OUT / "paper_fig8.png"
    plotted = plot(results, png)
    fair = LINK_MBIT / len(USERS)
    print(f"\n{'run':<10} {'user':<6} {'limit':>7} {'mean Mbit/s':>12} {'ratio':>7} {'Lark avg (job) Mbit/s':>22}")
    ratios = {"managed": [], "unmanaged": []}
    for run, res in results.items():
        for user, r in res.items():
            ref = r["request"] or fair
            ratio = r["mean"] / ref
            ratios[run].append(ratio)
            lark_avg = r["history"].get("NetworkIncomingAvgRate", "nan")
            lark_avg = float(lark_avg) / 1e6 if lark_avg not in ("undefined", "nan") else float("nan")
            print(f"{run:<10} {user:<6} {r['request'] or '-':>7} {r['mean']:>12.1f} {ratio:>7.3f} {lark_avg:>22.1f}")
    m, u = ratios["managed"], ratios["unmanaged"]
    print(f"managed: mean/limit {min(m):.3f}-{max(m):.3f} (goal 0.95-1.05 "
          f"{'met' if all(0.95 <= x <= 1.05 for x in m) else 'NOT met'}); unmanaged: mean/(link/3) "
          f"{min(u):.3f}-{max(u):.3f}; plot: {png if plotted else 'none'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
