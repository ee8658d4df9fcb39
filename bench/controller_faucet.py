"""Faucet against the same needs, on the same topology as bench/controller.py (for docs/design.md's choice).

Faucet (1.10.x) owns the switch's whole pipeline and is driven by a YAML file: a per-job rule is an ACL entry, and
a new rule reaches the switch on a config reload (SIGHUP). It learns hosts reactively (a packet-in per new MAC).
Measures, with Faucet controlling the private OVS: (1) the first packet of a new job (fresh MAC, ARP caches
flushed) to another job and to the WAN, next to plain NORMAL switching with the same fresh MACs; (2) the time from
adding one job's ACL rule to the file (with N jobs already in it) to that rule being on the switch.
Needs Faucet in its own virtualenv: FAUCET=/path/to/venv/bin/faucet (it pins an older os-ken than Lark's).
Last line: `faucet_first_packet_ratio=<faucet/plain> faucet_rule_p50_ms=<x>`.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
from helpers.sdn import BRIDGE, WAN_SERVER, SdnPool, free_port, sh  # noqa: E402

FAUCET = os.environ.get("FAUCET", "/tmp/lark-faucet-venv/bin/faucet")
TRIALS = int(os.environ.get("BENCH_TRIALS", "20"))
RELOADS = int(os.environ.get("BENCH_RELOADS", "10"))
JOBS_IN_FILE = int(os.environ.get("BENCH_FAUCET_JOBS", "200"))

PROBE = """
import json, subprocess, socket, sys, time
trials, ns, targets = int(sys.argv[1]), sys.argv[2], json.loads(sys.argv[3])
out = {name: [] for name in targets}
for i in range(trials):
    for k, (name, (ip, port, dst_ns)) in enumerate(targets.items()):
        mac = "02:99:%02x:%02x:00:%02x" % (i // 256, i % 256, k)   # a new job: a MAC nobody has seen
        for cmd in (["ip", "link", "set", "eth0", "address", mac], ["ip", "neigh", "flush", "all"],
                    ["ip", "-n", dst_ns, "neigh", "flush", "all"]):
            subprocess.run(cmd, check=True, capture_output=True)
        t = time.perf_counter()
        s = socket.create_connection((ip, port), timeout=3)
        out[name].append((time.perf_counter() - t) * 1000)
        s.close()
print(json.dumps(out))
"""


def faucet_yaml(ports: dict[str, int], job_macs: list[str]) -> str:
    rules = "".join(f"    - rule: {{dl_src: \"{m}\", actions: {{allow: 1}}}}\n" for m in job_macs)
    ifaces = "".join(f"      {no}: {{native_vlan: site{', acls_in: [jobs]' if name.startswith('j') else ''}}}\n"
                     for name, no in ports.items())
    return ("vlans:\n  site:\n    vid: 100\n"
            "dps:\n  core:\n    dp_id: 0x1\n    hardware: \"Open vSwitch\"\n    interfaces:\n" + ifaces +
            "acls:\n  jobs:\n" + rules + "    - rule: {actions: {allow: 1}}\n")


def first_packets(pool: SdnPool) -> dict[str, list[float]]:
    src = pool.jobs["a1"]["ns"]
    targets = {"job-to-job": [pool.ip("a2"), 9000, pool.jobs["a2"]["ns"]], "job-to-WAN": [WAN_SERVER, 7000, pool.wan]}
    cp = sh(["ip", "netns", "exec", src, sys.executable, "-c", PROBE, str(TRIALS), src, json.dumps(targets)])
    return json.loads(cp.stdout)


def main() -> int:
    if not os.path.exists(FAUCET):
        print(f"no Faucet at {FAUCET}: python3 -m venv /tmp/lark-faucet-venv && "
              "/tmp/lark-faucet-venv/bin/pip install faucet", file=sys.stderr)
        return 2
    tmp = tempfile.mkdtemp(prefix="lark-bench-faucet-")
    pool = SdnPool(tmp)
    faucet = None
    try:
        pool._netns(pool.core)
        pool.ovs.start()
        pool.ovs.vsctl("add-br", BRIDGE, "--", "set", "bridge", BRIDGE, "datapath_type=netdev",
                       "protocols=OpenFlow13", "fail_mode=secure", "other-config:datapath-id=0000000000000001")
        pool._make_wan()
        pool.add_job("a1", "ep1", "alice", 10)
        pool.add_job("a2", "ep2", "alice", 11)
        ports = {name: int(pool.ovs.vsctl("get", "Interface", name, "ofport"))
                 for name in pool.ovs.vsctl("list-ports", BRIDGE).split()}
        cfg = os.path.join(tmp, "faucet.yaml")
        macs = [f"02:98:00:{i // 256:02x}:{i % 256:02x}:01" for i in range(JOBS_IN_FILE)]
        with open(cfg, "w") as f:
            f.write(faucet_yaml(ports, macs + [pool.jobs[n]["reg"]["mac"] for n in ("a1", "a2")]))
        of_port = free_port()
        # faucet execs osken-manager from PATH: its own virtualenv's
        env = {**os.environ, "PATH": os.path.dirname(FAUCET) + ":" + os.environ["PATH"], "FAUCET_CONFIG": cfg, "FAUCET_LOG": os.path.join(tmp, "faucet.log"),
               "FAUCET_EXCEPTION_LOG": os.path.join(tmp, "faucet_exception.log"),
               "FAUCET_PROMETHEUS_ADDR": "127.0.0.1", "FAUCET_PROMETHEUS_PORT": str(free_port())}
        faucet = subprocess.Popen(["ip", "netns", "exec", pool.core, FAUCET, "--ryu-ofp-tcp-listen-port",
                                   str(of_port)], env=env, stdout=open(os.path.join(tmp, "faucet.out"), "w"), stderr=subprocess.STDOUT)
        pool.ovs.vsctl("set-controller", BRIDGE, f"tcp:127.0.0.1:{of_port}")
        mgmt = f"unix:{pool.ovs.dir}/{BRIDGE}.mgmt"

        def flows() -> str:
            return sh(["ovs-ofctl", "-O", "OpenFlow13", "dump-flows", mgmt], env=pool.ovs.env).stdout
        deadline = time.time() + 60
        while pool.jobs["a1"]["reg"]["mac"] not in flows():
            if time.time() > deadline or faucet.poll() is not None:
                raise RuntimeError("Faucet did not program the switch: "
                                   + open(os.path.join(tmp, "faucet.out")).read()[-3000:])
            time.sleep(0.2)
        n_flows = len(flows().splitlines()) - 1
        time.sleep(2)
        fau = first_packets(pool)
        # One more job: its ACL rule goes into the file, then a reload; time until it is on the switch.
        reload_ms = []
        for i in range(RELOADS):
            mac = f"02:97:00:00:{i:02x}:01"
            macs.append(mac)
            with open(cfg, "w") as f:
                f.write(faucet_yaml(ports, macs + [pool.jobs[n]["reg"]["mac"] for n in ("a1", "a2")]))
            t = time.perf_counter()
            faucet.send_signal(signal.SIGHUP)   # to `ip netns exec`, which passes it on by exec'ing faucet
            while mac not in flows():
                if time.perf_counter() - t > 60:
                    raise RuntimeError("reload did not install the new rule")
                time.sleep(0.005)
            reload_ms.append((time.perf_counter() - t) * 1000)
        # Plain NORMAL with the same fresh-MAC trials.
        pool.ovs.vsctl("del-controller", BRIDGE)
        sh(["ovs-ofctl", "-O", "OpenFlow13", "del-flows", mgmt], env=pool.ovs.env)
        sh(["ovs-ofctl", "-O", "OpenFlow13", "add-flow", mgmt, "priority=0,actions=NORMAL"], env=pool.ovs.env)
        plain = first_packets(pool)
    finally:
        if faucet is not None and faucet.poll() is None:
            faucet.kill()
            faucet.wait(10)
        pool.close()
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"Faucet bench: {TRIALS} new-job first packets per case, {RELOADS} rule reloads with {JOBS_IN_FILE}+ jobs "
          f"in the file ({n_flows} flows on the switch); private OVS userspace datapath, shared 2-vCPU machine")
    print(f"{'measure':<54} {'p50':>8} {'p90':>8}  unit")
    q = lambda xs, p: sorted(xs)[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]  # noqa: E731
    for conv in ("job-to-job", "job-to-WAN"):
        for name, d in (("plain NORMAL", plain), ("Faucet", fau)):
            print(f"{'first packet of a new job, ' + conv + ', ' + name:<54} {statistics.median(d[conv]):>8.2f} "
                  f"{q(d[conv], 90):>8.2f}  ms")
    print(f"{'one job rule: file + SIGHUP -> on the switch':<54} {statistics.median(reload_ms):>8.1f} "
          f"{q(reload_ms, 90):>8.1f}  ms")
    ratio = statistics.median(fau["job-to-job"] + fau["job-to-WAN"]) / statistics.median(
        plain["job-to-job"] + plain["job-to-WAN"])
    print(f"faucet_first_packet_ratio={ratio:.2f} faucet_rule_p50_ms={statistics.median(reload_ms):.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
