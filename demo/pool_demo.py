"""Live demo on a real HTCondor pool: jobs from three users ask for different networks; Lark's figures come
back in condor_history.

Builds (once, cached) and starts the testbed (testbed/testbed.py: a one-machine pool in its own network
namespace with an uplink to a "world" namespace serving files), adds the paper's NetworkType policy,
submits a handful of jobs, waits for them, prints one table from condor_history, then stops the pool and
removes everything it started. The jobs use file transfer, as on a pool without a shared filesystem (their
program is the EP's python3; their output comes back at the end), and the demo fails (exit 1) when a job's event
log shows that it started more than once or was evicted.
"""
from __future__ import annotations

import logging
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "testbed"))
import eventlog  # noqa: E402
import testbed  # noqa: E402

log = logging.getLogger("demo")
POLICY_CONF = testbed.ROOT / "etc/condor/config.d/95-demo-policy.conf"
URL = f"http://{testbed.WORLD_IP}:8000/50M.bin"
DOWNLOAD = (f'import urllib.request, time; t = time.time(); n = len(urllib.request.urlopen("{URL}").read()); '
            'print(n, "bytes in", round(time.time() - t, 2), "s")')
PROBE = (f'import socket; s = socket.socket(); s.settimeout(3); '
         f'print("connect to the world:", s.connect_ex(("{testbed.WORLD_IP}", 8000)))')

# (user, directory, what the job asks for, program)
JOBS = [
    ("alice", "demo-nat", "", DOWNLOAD),
    ("bob", "demo-none", "+OutboundConnectivity = false", PROBE),
    ("carol", "demo-bw100", "request_bandwidth = 100", DOWNLOAD),
    ("alice", "demo-bw600", "request_bandwidth = 600", DOWNLOAD),
]
COLUMNS = [("job", "GlobalJobId"), ("owner", "Owner"), ("asked", None), ("mode", "LarkNetworkType"),
           ("address", "LarkIPv4Address"), ("bw Mbit/s", "RequestBandwidth"), ("bytes in", "NetworkIncomingBytes"),
           ("bytes out", "NetworkOutgoingBytes"), ("avg in", "NetworkIncomingAvgRate"),
           ("peak in", "NetworkIncomingPeakRate"), ("exit", "ExitCode")]


def submit_file(extra: str, program: str) -> str:
    args = "-c '" + program.replace('"', '""') + "'"
    return (f'executable = /usr/bin/python3\ntransfer_executable = false\narguments = "{args}"\n'
            "output = out.txt\nerror = err.txt\nlog = log.txt\n"
            f"should_transfer_files = YES\nwhen_to_transfer_output = ON_EXIT\n{extra}\nqueue\n")


def rate(v: str) -> str:
    try:
        bps = float(v)
    except ValueError:
        return "-"
    return f"{bps / 1e6:.1f} Mbit/s" if bps >= 1e5 else f"{bps / 1e3:.1f} kbit/s"


def wait_history(clusters: dict[int, str], timeout: float = 300) -> dict[int, dict]:
    attrs = [a for _, a in COLUMNS if a]
    rows: dict[int, dict] = {}
    deadline = time.time() + timeout
    while time.time() < deadline and len(rows) < len(clusters):
        for c in clusters:
            if c in rows:
                continue
            cp = testbed.run(testbed.in_root(["condor_history", str(c), "-af:t", *attrs]), check=False)
            line = cp.stdout.strip()
            if line:
                rows[c] = dict(zip(attrs, line.split("\t")))
        time.sleep(2)
    return rows


def show(clusters: dict[int, str], rows: dict[int, dict]) -> None:
    table = [[h for h, _ in COLUMNS]]
    for c, asked in clusters.items():
        r = rows.get(c, {})
        cells = []
        for head, attr in COLUMNS:
            v = (asked or "(nothing)") if head == "asked" else r.get(attr, "?")
            if head == "job":
                v = f"{c}.0"
            elif head in ("avg in", "peak in"):
                v = rate(v)
            cells.append("-" if v == "undefined" else v)
        table.append(cells)
    widths = [max(len(row[i]) for row in table) for i in range(len(COLUMNS))]
    for i, row in enumerate(table):
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths)))
        if i == 0:
            print("  ".join("-" * w for w in widths))


def not_started_once(described: list[str]) -> bool:
    """Print the jobs whose event logs show more than one start or an eviction (eventlog.describe lines); any?"""
    if described:
        print("jobs that did NOT start exactly once (their event logs):")
        for line in described:
            print(f"  {line}")
        print()
    return bool(described)


def stop_pool() -> None:
    """Stop the testbed, and say so if its namespaces outlived it."""
    testbed.stop()
    leftovers = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    if testbed.HOST_NS in leftovers or testbed.WORLD_NS in leftovers:
        log.error("testbed namespaces are still there: %s", leftovers)


def main() -> int:
    logging.basicConfig(level=logging.INFO, format="demo: %(message)s")
    testbed.prepare("demo")
    policy = (REPO / "policies/network_type_by_connectivity.ad").read_text().strip().splitlines()[-1]
    POLICY_CONF.write_text(policy + "\n")
    try:
        testbed.start()
        clusters: dict[int, str] = {}
        for user, name, extra, program in JOBS:
            c = testbed.submit_as(user, name, submit_file(extra, program))
            clusters[c] = extra.replace("+", "")
            log.info("%s submitted job %d.0 asking for: %s", user, c, extra or "(nothing: Lark's defaults)")
        rows = wait_history(clusters)
        print()
        show(clusters, rows)
        print()
        restarted = []
        for (user, name, _, _), c in zip(JOBS, clusters):
            d = testbed.ROOT / "home" / user / name
            out = d / "out.txt"
            print(f"job {c}.0 ({user}) printed: {out.read_text().strip() if out.exists() else '(no out.txt)'}")
            restarted += [eventlog.describe(job, events)
                          for job, events in eventlog.not_once(d / "log.txt", [f"{c}.0"]).items()]
        print()
        if not_started_once(restarted):
            return 1
        if len(rows) != len(clusters):
            print(f"only {len(rows)} of {len(clusters)} jobs reached the history")
            return 1
        print(f"every job started once and finished ({len(clusters)} of {len(clusters)}, file transfer)")
        return 0
    finally:
        POLICY_CONF.unlink(missing_ok=True)
        stop_pool()


if __name__ == "__main__":
    sys.exit(main())
