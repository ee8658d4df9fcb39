"""Per-job network setup/teardown latency: Lark vs the CNI chain a Kubernetes/Podman node would use.

Runs inside a private "host" netns (made here, removed at the end). Each job is a process in an empty netns
(`unshare -n`), as HTCondor's NO_JOB_NETWORKING makes it. Lark: the same JobNetworker code larkd runs
(netns name + veth + address + NAT + counters). CNI: Debian's containernetworking-plugins, bridge + host-local
with ipMasq (no bandwidth plugin: no limits are set in the CNI run). One more Lark row has bench/e2e_latency.py's
job shape: NAT with a 100 Mbit/s limit each way, as a slot's Bandwidth gives it. Prints a table, the per-mode
goals with met/missed (bench/goals.py), then one key=value line.
"""
from __future__ import annotations

import concurrent.futures
import json
import os
import secrets
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import goals  # noqa: E402 (bench/goals.py)
import runfs  # noqa: E402 (bench/runfs.py)

N_SEQ = int(os.environ.get("BENCH_N", "50"))
N_CONC = 16
LIMIT_MBIT = 100  # bench/e2e_latency.py's slots' Bandwidth
CNI_PATH = "/usr/lib/cni"


def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


def spawn_jobs(n: int) -> list[subprocess.Popen]:
    return [subprocess.Popen(["unshare", "--net", "sleep", "600"]) for _ in range(n)]


def wait_unshared(procs):
    me = os.stat("/proc/self/ns/net").st_ino
    for p in procs:
        while os.stat(f"/proc/{p.pid}/ns/net").st_ino == me:
            time.sleep(0.001)


def lark_runner(tmp: str, mode: str = "nat", address_type: str = "static", limit_mbit: float | None = None,
                **extra):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from lark.kernel.accounting import Accountant
    from lark.config import Config
    from lark.kernel.firewall import make_firewall
    from lark.daemon.jobnet import JobNetworker
    from lark.plan import NetworkPlan
    from lark.daemon.records import FinishedStore, RecordStore
    from lark.kernel import netns

    cfg = Config(run_dir=f"{tmp}/run", state_dir=f"{tmp}/state", netns_prefix=f"lark-b{secrets.token_hex(2)}-",
                 uplink="up0", subnet="10.214.0.0/22", bridge_name="lkbr0", bridge_range="10.216.0.100-10.216.0.250",
                 bridge_gateway="10.216.0.1", **extra).validate()
    fw = make_firewall(cfg)
    fw.ensure_base()
    netns.ensure_netns_dir(cfg.netns_dir)
    net = JobNetworker(cfg, fw, RecordStore(cfg.records_dir), Accountant(fw),
                       FinishedStore(f"{tmp}/state/finished"))

    def setup(i: int, pid: int) -> float:
        key = f"b{i}"
        plan = NetworkPlan(job_id=f"{i}.0", slot=key, key=key, network_type=mode, address_type=address_type,
                           rate_limit_mbit=limit_mbit)
        t = time.perf_counter()
        net.setup(plan, os.getpid(), 0, pid, netns.netns_inode_of_pid(pid))
        return (time.perf_counter() - t) * 1000

    def teardown(i: int) -> float:
        t = time.perf_counter()
        net.teardown(f"b{i}", "bench")
        return (time.perf_counter() - t) * 1000

    return setup, teardown, fw, net


def cni_runner(tmp: str):
    conf = json.dumps({"cniVersion": "1.0.0", "name": "benchnet", "type": "bridge", "bridge": "cnibr0",
                       "isGateway": True, "ipMasq": True,
                       "ipam": {"type": "host-local", "subnet": "10.215.0.0/22", "dataDir": f"{tmp}/cni-ipam"}})

    def call(cmd: str, i: int, pid: int) -> float:
        env = {"CNI_COMMAND": cmd, "CNI_CONTAINERID": f"bench{i}", "CNI_NETNS": f"/proc/{pid}/ns/net",
               "CNI_IFNAME": "eth0", "CNI_PATH": CNI_PATH, "PATH": os.environ["PATH"]}
        t = time.perf_counter()
        cp = subprocess.run([f"{CNI_PATH}/bridge"], input=conf, env=env, capture_output=True, text=True)
        if cp.returncode != 0:
            raise RuntimeError(f"CNI {cmd} failed: {cp.stdout} {cp.stderr}")
        return (time.perf_counter() - t) * 1000

    return (lambda i, pid: call("ADD", i, pid)), (lambda i, pid: call("DEL", i, pid))


def run_mode(tmp: str, label: str, n: int, mode: str, address_type: str = "static", cold: bool = False,
             limit_mbit: float | None = None, **extra) -> tuple[list[float], list[float]]:
    setup, teardown, fw, net = lark_runner(f"{tmp}/{label.replace(' ', '_')}", mode, address_type, limit_mbit,
                                           **extra)
    procs = spawn_jobs(n)
    wait_unshared(procs)
    s_times, t_times = [], []
    try:
        for i, p in enumerate(procs):
            key = f"b{i % 4}" if address_type == "dhcp" else f"b{i}"  # DHCP: a few slots, so leases recur
            if cold:
                net.leases.drop(key)
            s_times.append(setup(int(key[1:]), p.pid))
            t_times.append(teardown(int(key[1:])))
    finally:
        for p in procs:
            p.kill()
            p.wait()
    return s_times, t_times


def inner() -> None:
    tmp = runfs.tmpfs_dir("lark-bench-")  # larkd's run_dir on tmpfs, as on an EP (bench/runfs.py)
    setup, teardown, fw, _ = lark_runner(tmp)
    cni_add, cni_del = cni_runner(tmp)
    rows = []
    # Lark sequential
    procs = spawn_jobs(N_SEQ)
    wait_unshared(procs)
    s_seq = [setup(i, p.pid) for i, p in enumerate(procs)]
    t_seq = [teardown(i) for i in range(N_SEQ)]
    for p in procs:
        p.kill(); p.wait()
    # Lark concurrent
    procs = spawn_jobs(N_CONC)
    wait_unshared(procs)
    with concurrent.futures.ThreadPoolExecutor(N_CONC) as ex:
        s_conc = list(ex.map(lambda a: setup(*a), [(100 + i, p.pid) for i, p in enumerate(procs)]))
        t_conc = list(ex.map(teardown, [100 + i for i in range(N_CONC)]))
    for p in procs:
        p.kill(); p.wait()
    # CNI sequential
    procs = spawn_jobs(N_SEQ)
    wait_unshared(procs)
    c_seq = [cni_add(i, p.pid) for i, p in enumerate(procs)]
    c_del = [cni_del(i, p.pid) for i, p in enumerate(procs)]
    for p in procs:
        p.kill(); p.wait()
    fw.destroy_base()
    # Bridged modes: the bench makes the bridge (larkd adopts it) and a DHCP server on it.
    # The DHCP server sits in its own namespace on the bridge, as on a site network (jobs may not talk to
    # the host itself over the bridge).
    site = f"{os.environ['LARK_BENCH_NETNS']}-site"
    subprocess.run(["ip", "link", "add", "lkbr0", "type", "bridge", "forward_delay", "0"], check=True)
    subprocess.run(["ip", "link", "set", "lkbr0", "up"], check=True)
    subprocess.run(["ip", "netns", "add", site], check=True)
    subprocess.run(["ip", "link", "add", "site0", "type", "veth", "peer", "name", "dh0", "netns", site], check=True)
    subprocess.run(["ip", "link", "set", "site0", "master", "lkbr0", "up"], check=True)
    subprocess.run(["ip", "-n", site, "addr", "add", "10.216.0.1/24", "dev", "dh0"], check=True)
    subprocess.run(["ip", "-n", site, "link", "set", "dh0", "up"], check=True)
    dnsmasq = subprocess.Popen(["nsenter", f"--net=/run/netns/{site}",
                                "dnsmasq", "--keep-in-foreground", "--no-ping", "--port=0", "--user=root",
                                "--interface=dh0", "--bind-interfaces", "--conf-file=/dev/null", "--pid-file=",
                                "--dhcp-range=10.216.0.2,10.216.0.99,255.255.255.0,1h",
                                f"--dhcp-leasefile={tmp}/dnsmasq.leases", "--dhcp-authoritative"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(0.5)
    modes = {}
    try:
        modes[f"nat limited {LIMIT_MBIT} Mbit/s"] = run_mode(tmp, "nat limited", N_SEQ, "nat", limit_mbit=LIMIT_MBIT)
        n = max(N_SEQ // 2, 10)
        modes["bridge static"] = run_mode(tmp, "bridge static", n, "bridge")
        modes["bridge dhcp, cold"] = run_mode(tmp, "bridge dhcp cold", n, "bridge", "dhcp", cold=True)
        modes["bridge dhcp, cached lease"] = run_mode(tmp, "bridge dhcp cached", n, "bridge", "dhcp")
        ovs = start_ovs(tmp)
        if ovs:
            try:
                modes["ovs static"] = run_mode(tmp, "ovs static", n, "ovs_bridge", ovs_db=f"unix:{ovs.sock}",
                                               ovs_rundir=str(ovs.dir), ovs_datapath="netdev")
            finally:
                ovs.close()
    finally:
        dnsmasq.terminate()
        dnsmasq.wait(10)
        subprocess.run(["ip", "netns", "del", site])
        fw.destroy_base()
    for name, xs in (("lark setup, sequential", s_seq), ("lark teardown, sequential", t_seq),
                     (f"lark setup, {N_CONC} concurrent", s_conc), (f"lark teardown, {N_CONC} concurrent", t_conc),
                     ("cni bridge+host-local ADD, sequential", c_seq), ("cni DEL, sequential", c_del)):
        rows.append((name, len(xs), statistics.median(xs), pct(xs, 99), max(xs)))
    for name, (st, td) in modes.items():
        rows.append((f"lark {name} setup", len(st), statistics.median(st), pct(st, 99), max(st)))
        rows.append((f"lark {name} teardown", len(td), statistics.median(td), pct(td, 99), max(td)))
    print(f"{'measurement':<40} {'n':>4} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8}")
    for r in rows:
        print(f"{r[0]:<40} {r[1]:>4} {r[2]:>8.1f} {r[3]:>8.1f} {r[4]:>8.1f}")
    p50 = statistics.median(s_seq)
    # (mode, percentile, goal ms): issue 15 for OVS (p50 <= 25) and a cold DHCP setup (p99 <= 100), issue 5 before
    mode_goals = [goals.Goal(f"{name.replace(' ', '_').replace(',', '')}_p{q}_ms", f"lark {name} setup, p{q}",
                             pct(modes[name][0], q), "<=", goal)
                  for name, q, goal in (("bridge static", 50, 20), ("ovs static", 50, 25),
                                        ("bridge dhcp, cached lease", 50, 50), ("bridge dhcp, cold", 99, 100))
                  if name in modes]
    print()
    print(goals.table(mode_goals, "per-mode goals (issues 5, 15); issue 27's are e2e_latency.py's"))
    print()
    limited = modes[f"nat limited {LIMIT_MBIT} Mbit/s"][0]
    print(f"setup_p50_ms={p50:.1f} setup_p99_ms={pct(s_seq, 99):.1f} teardown_p50_ms={statistics.median(t_seq):.1f} "
          f"limited_setup_p50_ms={statistics.median(limited):.1f} "
          f"cni_p50_ms={statistics.median(c_seq):.1f} speedup={statistics.median(c_seq) / p50:.2f} "
          + " ".join(f"{g.key}={g.value:.1f}" for g in mode_goals) + f" {goals.fields(mode_goals)}")
    subprocess.run(["rm", "-rf", tmp])


def start_ovs(tmp: str):
    """A private OVS (tests/helpers/ovs.py) in this netns, or None when OVS is not installed."""
    if not shutil.which("ovs-vswitchd"):
        return None
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
    from helpers.ovs import PrivateOVS
    me = os.environ["LARK_BENCH_NETNS"]
    return PrivateOVS(f"{tmp}/ovs", me).start()


def in_private_host(argv: list[str], prefix: str = "lark-bench-host") -> int:
    """Run `argv` in a private "host" netns with an uplink `up0` (up), made here and removed at the end; its name
    is in LARK_BENCH_NETNS."""
    ns = f"{prefix}-{secrets.token_hex(3)}"
    subprocess.run(["ip", "netns", "add", ns], check=True)
    try:
        subprocess.run(["ip", "-n", ns, "link", "add", "up0", "type", "veth", "peer", "name", "up0p"], check=True)
        subprocess.run(["ip", "-n", ns, "link", "set", "up0", "up"], check=True)
        return subprocess.run(["nsenter", f"--net=/run/netns/{ns}", *argv],
                              env={**os.environ, "LARK_BENCH_NETNS": ns}).returncode
    finally:
        subprocess.run(["ip", "netns", "del", ns])


def main() -> int:
    if "--inner" in sys.argv:
        inner()
        return 0
    return in_private_host([sys.executable, __file__, "--inner"])


if __name__ == "__main__":
    sys.exit(main())
