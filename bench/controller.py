"""lark-controller figures on a private OVS switch (userspace datapath) with the real controller process.

Topology (tests/helpers/sdn.py, everything made here and removed at the end): a core netns with the switch and the
controller, job namespaces on switch ports, a WAN router netns on ports wan0/wan1. Measures:
  * first-packet latency of a new conversation (ARP caches and the switch's MAC table flushed before each trial),
    job-to-job and job-to-WAN, with plain NORMAL switching and with the controller's proactive flows;
  * registration request -> flows acknowledged by the switch (the API answers after an OpenFlow barrier), p50/p99,
    and registrations per second (sequential and 4 concurrent EPs);
  * flows per job; controller RSS with 1,000 and 10,000 registered jobs (simulated registrations, one resync).
Prints a table, then `first_packet_ratio=<controller/plain> flows_per_job=<n> register_p99_ms=<x>`.
"""
from __future__ import annotations

import concurrent.futures
import json
import os
import shutil
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
from helpers.sdn import BRIDGE, GW, SLICE_AND_WAN_POLICIES, WAN_SERVER, SdnPool, sh  # noqa: E402

from lark.controller import certs

TRIALS = int(os.environ.get("BENCH_TRIALS", "10"))   # per block and case
BLOCKS = 3
N_REG = int(os.environ.get("BENCH_REGISTRATIONS", "300"))
POLICIES = SLICE_AND_WAN_POLICIES


def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


def ofctl(pool: SdnPool, *args: str) -> None:
    sh(["ovs-ofctl", "-O", "OpenFlow13", *args], env=pool.ovs.env)


PROBE = """
import json, socket, subprocess, sys, time
trials, targets, flushes = int(sys.argv[1]), json.loads(sys.argv[2]), json.loads(sys.argv[3])
out = {name: [] for name in targets}
for _ in range(trials):
    for name, (ip, port, dst_ns) in targets.items():
        for cmd in flushes + [["ip", "-n", dst_ns, "neigh", "flush", "all"]]:
            subprocess.run(cmd, check=True, capture_output=True)
        t = time.perf_counter()
        s = socket.create_connection((ip, port), timeout=3)   # SYN out, SYN-ACK back: the first packets
        out[name].append((time.perf_counter() - t) * 1000)
        s.close()
print(json.dumps(out))
"""


def latencies(pool: SdnPool) -> dict[str, list[float]]:
    """TCP connect time of new conversations from job a1: no ARP entry on either side, the switch's MAC table
    flushed, so the first packets (ARP, SYN) meet the flows exactly as a job's first packet would."""
    src = pool.jobs["a1"]["ns"]
    targets = {"job-to-job": [pool.ip("a2"), 9000, pool.jobs["a2"]["ns"]], "job-to-WAN": [WAN_SERVER, 7000, pool.wan]}
    flushes = [["ip", "-n", src, "neigh", "flush", "all"],
               ["ovs-appctl", "-t", str(pool.ovs.dir / "vswitchd.ctl"), "fdb/flush", BRIDGE]]
    cp = sh(["ip", "netns", "exec", src, sys.executable, "-c", PROBE, str(TRIALS), json.dumps(targets),
             json.dumps(flushes)])
    return json.loads(cp.stdout)


def fake_reg(i: int) -> dict:
    return {"key": f"sim{i}", "job_id": f"{100000 + i}.0", "owner": f"user{i % 50}",
            "accounting_group": ("cms" if i % 3 == 0 else ""), "addresses": [f"10.{78 + i // 65000}.{i // 250 % 250}.{i % 250 + 1}"],
            "mac": f"02:78:{i >> 16 & 255:02x}:{i >> 8 & 255:02x}:{i & 255:02x}:01"}


def registrations(pool: SdnPool) -> tuple[list[float], list[float], float, float]:
    """Client-side time (new TLS connection, request, flows + barrier acknowledged, answer) and the controller's
    own time from request to barrier reply."""
    times, server = [], []
    t0 = time.perf_counter()
    for i in range(N_REG):
        t = time.perf_counter()
        code, body = pool.api("POST", "/v1/jobs", fake_reg(i), cert="ep1")
        times.append((time.perf_counter() - t) * 1000)
        server.append(body["ms"])
        assert code == 200 and body["switches"] == 1, body
    seq_rate = N_REG / (time.perf_counter() - t0)

    def one_ep(k: int, ep: str) -> None:
        for i in range(N_REG // 4):   # each EP its own jobs: another EP's MAC or address is refused (issue 26)
            code, body = pool.api("POST", "/v1/jobs", fake_reg(20000 + 5000 * k + i), cert=ep)
            assert code == 200, body
    t0 = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(4) as ex:
        list(ex.map(one_ep, range(4), ["ep1", "ep2", "intruder", "ep3"]))   # the controller's cert registers nothing
    conc_rate = 4 * (N_REG // 4) / (time.perf_counter() - t0)
    return times, server, seq_rate, conc_rate


def larkd_client_registrations(pool: SdnPool) -> list[float]:
    """The path larkd takes (lark.daemon.controller_client: one kept-alive TLS connection), timed per job from
    the call to the controller's acknowledgement."""
    from lark.config import Config
    from lark.daemon.controller_client import ControllerClient
    from lark.kernel import netns as nsutil
    from lark.plan import Addresses, JobNetwork, NetworkPlan
    cfg = Config(controller_url=f"https://127.0.0.1:{pool.api_port}", controller_ca=str(pool.tls / "ca.pem"),
                 controller_cert=str(pool.tls / "ep1.pem"), controller_key=str(pool.tls / "ep1.key"),
                 controller_timeout=5.0).validate()
    client = ControllerClient(cfg, records=None)
    times = []
    fd = os.open(f"/run/netns/{pool.core}", os.O_RDONLY)
    try:
        with nsutil.entered(fd):   # the controller listens on the core netns' loopback
            for i in range(N_REG):
                r = fake_reg(40000 + i)
                plan = JobNetwork(NetworkPlan(job_id=r["job_id"], slot=f"slot{i}", key=r["key"], network_type="bridge",
                                              owner=r["owner"], accounting_group=r["accounting_group"]),
                                  Addresses(ipv4=r["addresses"][0]))
                t = time.perf_counter()
                client.register(plan, r["mac"])   # raises unless acknowledged (controller_failure = closed)
                times.append((time.perf_counter() - t) * 1000)
    finally:
        os.close(fd)
    return times


def scale(pool: SdnPool, n: int) -> tuple[int, float, int, int]:
    """RSS (KiB) with n registered jobs, the time one resync of that size took, and flows on the switch."""
    t0 = time.perf_counter()
    code, body = pool.api("PUT", "/v1/sync", {"jobs": [fake_reg(i) for i in range(n)]}, cert="ep1", timeout=600)
    took = time.perf_counter() - t0
    assert code == 200, body
    st = pool.api("GET", "/v1/status", cert="controller")[1]
    return st["rss_kib"], took, st["totals"]["flows_per_switch"], st["totals"]["jobs"]


class BenchPool(SdnPool):
    """ep1 resyncs 10,000 jobs here, more than an EP's default quota ([api] max_jobs_per_ep = 4096)."""

    def write_config(self) -> None:
        super().write_config()
        certs.make(str(self.tls), ["ep3"])   # a fourth EP for the concurrent registrations
        self.cfg_path.write_text(self.cfg_path.read_text().replace("[api]\n", "[api]\nmax_jobs_per_ep = 20000\n", 1))


def main() -> int:
    if os.geteuid() != 0:
        print("bench/controller.py needs root (namespaces, OVS)", file=sys.stderr)
        return 2
    tmp = tempfile.mkdtemp(prefix="lark-bench-ctl-")
    pool = BenchPool(tmp, policies=POLICIES, reconcile_grace=3600)
    rows = []
    try:
        pool.start()
        pool.add_job("a1", "ep1", "alice", 10)
        pool.add_job("a2", "ep2", "alice", 11)
        mgmt = f"unix:{pool.ovs.dir}/{BRIDGE}.mgmt"
        plain: dict[str, list[float]] = {"job-to-job": [], "job-to-WAN": []}
        ctl: dict[str, list[float]] = {"job-to-job": [], "job-to-WAN": []}
        # Alternate blocks of plain and controller trials, so the machine's changing load hits both alike.
        for block in range(BLOCKS):
            # Plain switching: no controller, one NORMAL flow.
            pool.ovs.vsctl("del-controller", BRIDGE)
            ofctl(pool, "del-flows", mgmt)
            ofctl(pool, "add-flow", mgmt, "priority=0,actions=NORMAL")
            for k, v in latencies(pool).items():
                plain[k] += v
            # With the controller: it installs its base flows and every registered job's flows on connect.
            ofctl(pool, "del-flows", mgmt)
            pool.ovs.vsctl("set-controller", BRIDGE, f"ssl:127.0.0.1:{pool.of_port}")   # set-ssl by start()
            if block == 0:
                time.sleep(1)
                pool.wait_switch()
                for name in ("a1", "a2"):
                    code, body = pool.register(name)
                    assert code == 200, body
            deadline = time.time() + 30
            while len([f for f in pool.flows() if "cookie=0x4a" in f]) < 10 and time.time() < deadline:
                time.sleep(0.1)
            assert pool.connects("a1", pool.ip("a2")) and pool.connects("a1", GW, 7000)
            for k, v in latencies(pool).items():
                ctl[k] += v
        st = pool.api("GET", "/v1/status", cert="controller")[1]
        flows_per_job = max(j["flows"] for j in st["jobs"])
        for conv in ("job-to-job", "job-to-WAN"):
            rows.append((f"first packet {conv}, plain NORMAL", statistics.median(plain[conv]), pct(plain[conv], 90),
                         "ms"))
            rows.append((f"first packet {conv}, controller", statistics.median(ctl[conv]), pct(ctl[conv], 90), "ms"))
        reg, server, seq_rate, conc_rate = registrations(pool)
        rows.append(("registration -> flows acknowledged, new TLS conn (p50/p99)", statistics.median(reg),
                     pct(reg, 99), "ms"))
        rows.append(("  of which in the controller: request -> barrier", statistics.median(server),
                     pct(server, 99), "ms"))
        kept = larkd_client_registrations(pool)
        rows.append(("  larkd's client, kept-alive connection (p50/p99)", statistics.median(kept), pct(kept, 99),
                     "ms"))
        rows.append(("registrations per second (1 EP / 4 EPs at once)", seq_rate, conc_rate, "/s"))
        # Only ep1's simulated jobs remain besides the other EPs' 4 x N_REG/4: count what is registered.
        rss1k, t1k, f1k, n1k = scale(pool, 1000)
        rss10k, t10k, f10k, n10k = scale(pool, 10000)
        rows.append((f"controller RSS with {n1k} / {n10k} registered jobs", rss1k / 1024, rss10k / 1024, "MiB"))
        rows.append((f"flows on the switch with {n1k} / {n10k} jobs", f1k, f10k, "flows"))
        rows.append(("ep1 resync to 1,000 / to 10,000 jobs (flows + barrier)", t1k, t10k, "s"))
        rows.append(("flows per job (sliced; blocked: 2) / base flows", flows_per_job, st["totals"]["base_flows"], ""))
    finally:
        pool.close()
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"lark-controller bench: {BLOCKS} x {TRIALS} first-packet trials per case (blocks alternate), {N_REG} registrations; private OVS "
          f"{'userspace'} datapath on a shared 2-vCPU machine (figures under load)")
    print(f"{'measure':<58} {'a':>10} {'b':>10}  unit")
    for name, a, b, unit in rows:
        print(f"{name:<58} {a:>10.2f} {b:>10.2f}  {unit}")
    all_plain = plain["job-to-job"] + plain["job-to-WAN"]
    all_ctl = ctl["job-to-job"] + ctl["job-to-WAN"]
    ratio = statistics.median(all_ctl) / statistics.median(all_plain)
    # register_p99_ms: the path larkd takes (kept-alive connection), request to barrier acknowledged.
    print(f"first_packet_ratio={ratio:.2f} flows_per_job={flows_per_job} register_p99_ms={pct(kept, 99):.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
