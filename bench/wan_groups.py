"""WAN group limits (issue 12): policing by the controller's OpenFlow 1.3 meter vs shaping by an htb on the WAN
port, on a private OVS switch (userspace datapath) with the real controller process (tests/helpers/sdn.py
topology: everything is made here and removed at the end).

Two jobs of one group upload TCP (iperf3, one stream each) to the WAN host at the same time, the group limited to
RATE Mbit/s: (a) by the meter the controller creates for the group ([[wan_group]]), (b) by an htb class on the
WAN port (tc u32 by the jobs' source addresses; no meter). Then UDP offered at 2 x RATE through the meter.
Prints a table, then `police_tcp_ratio=<aggregate/rate> shape_tcp_ratio=<..> police_udp_ratio=<..>`.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))

from helpers.sdn import WAN_SERVER, SdnPool, sh  # noqa: E402
from helpers.wan_traffic import udp_upload  # noqa: E402

RATE = int(os.environ.get("WAN_BENCH_RATE", "50"))       # Mbit/s per group
SECONDS = int(os.environ.get("WAN_BENCH_SECONDS", "8"))

def tcp_upload(pool: SdnPool, names: list[str]) -> list[float]:
    """Goodput in Mbit/s of each job's concurrent iperf3 TCP upload, as the receiver saw it."""
    servers = [subprocess.Popen(["ip", "netns", "exec", pool.wan, "iperf3", "-s", "-1", "-p", str(5401 + i)],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for i in range(len(names))]
    pool.procs.extend(servers)
    time.sleep(0.5)
    clients = [subprocess.Popen(["ip", "netns", "exec", pool.jobs[n]["ns"], "iperf3", "-c", WAN_SERVER, "-p",
                                 str(5401 + i), "-t", str(SECONDS), "-J"], stdout=subprocess.PIPE, text=True)
               for i, n in enumerate(names)]
    pool.procs.extend(clients)
    out = []
    for c in clients:
        data = json.loads(c.communicate(timeout=SECONDS + 60)[0])
        out.append(data["end"]["sum_received"]["bits_per_second"] / 1e6)
    return out


def wan_rx_bytes(pool: SdnPool) -> int:
    return json.loads(sh(["ip", "-n", pool.wan, "-j", "-s", "link", "show", "w0"]).stdout)[0]["stats64"]["rx"]["bytes"]


def main() -> int:
    if os.geteuid() != 0:
        print("bench/wan_groups.py needs root (namespaces, OVS)", file=sys.stderr)
        return 2
    groups = f'[[wan_group]]\nname = "cms"\nselect = \'AcctGroup =?= "cms"\'\nrate_mbit = {RATE}\n'
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        pool = SdnPool(tmp, policies=groups)
        try:
            pool.start()
            for name, n, group in (("c1", 10, "cms"), ("c2", 11, "cms"), ("u1", 12, ""), ("u2", 13, "")):
                pool.add_job(name, "ep1", name, n, group=group)
                assert pool.register(name)[0] == 200
            police = tcp_upload(pool, ["c1", "c2"])
            # shaping: an htb on the WAN port (egress toward the router), the unmetered jobs classified by source
            sh(["tc", "-n", pool.core, "qdisc", "add", "dev", "wan0", "root", "handle", "1:", "htb", "default", "20"])
            sh(["tc", "-n", pool.core, "class", "add", "dev", "wan0", "parent", "1:", "classid", "1:10", "htb",
                "rate", f"{RATE}mbit", "ceil", f"{RATE}mbit"])
            sh(["tc", "-n", pool.core, "class", "add", "dev", "wan0", "parent", "1:", "classid", "1:20", "htb",
                "rate", "10gbit"])
            for n in ("u1", "u2"):
                sh(["tc", "-n", pool.core, "filter", "add", "dev", "wan0", "parent", "1:", "protocol", "ip", "u32",
                    "match", "ip", "src", f"{pool.ip(n)}/32", "flowid", "1:10"])
            shape = tcp_upload(pool, ["u1", "u2"])
            before = wan_rx_bytes(pool)
            udp_upload(pool, ["c1", "c2"], RATE, SECONDS)
            udp = (wan_rx_bytes(pool) - before) * 8 / SECONDS / 1e6
            st = pool.api("GET", "/v1/status", cert="controller")[1]["wan_groups"][0]
        finally:
            pool.close()
    rows = [("TCP, 2 jobs, OpenFlow meter (policing)", police), ("TCP, 2 jobs, htb on WAN port (shaping)", shape)]
    print(f"WAN group limit {RATE} Mbit/s, {SECONDS} s per run, private OVS userspace datapath, shared 2-core machine")
    print(f"{'case':<44} {'job 1':>8} {'job 2':>8} {'sum':>8} {'sum/rate':>9} {'job1/job2':>9}")
    for name, (a, b) in rows:
        print(f"{name:<44} {a:>8.1f} {b:>8.1f} {a + b:>8.1f} {(a + b) / RATE:>9.3f} {a / b:>9.2f}")
    print(f"{'UDP 2 x ' + str(RATE) + ' Mbit/s offered, meter (wire bytes)':<44} {'':>8} {'':>8} {udp:>8.1f} "
          f"{udp / RATE:>9.3f}")
    print(f"meter bytes counted by the controller: {st['bytes']}")
    print(f"police_tcp_ratio={sum(police) / RATE:.3f} shape_tcp_ratio={sum(shape) / RATE:.3f} "
          f"police_udp_ratio={udp / RATE:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
