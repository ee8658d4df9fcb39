"""WAN group limits (issue 12): the controller's two mechanisms side by side, policing by OpenFlow 1.3 meters
(`[wan] mechanism = "meter"`) and shaping by queues (`"queue"`: Lark's linux-htb QoS/Queue rows, per-job tc classes
and u32 filters on this userspace datapath), each on a private OVS switch with the real controller process
(tests/helpers/sdn.py topology: everything is made here and removed at the end).

Per mechanism: two jobs of one group upload TCP (iperf3, one stream each) to the WAN host at the same time, RUNS
times, the group limited to RATE Mbit/s; then both offer UDP at RATE each (2 x RATE in all). TCP goodput is compared
with RATE x 0.956 (TCP/IP/Ethernet headers of a 1500-byte packet), UDP with RATE (wire bytes at the WAN router).
Prints a table, then `police_tcp_ratio=.. shape_tcp_ratio=.. police_tcp_share=.. shape_tcp_share=..
police_udp_ratio=.. shape_udp_ratio=..` (ratios: aggregate / expected; share: the lower job / the higher, mean).
"""
from __future__ import annotations

import logging
import os
import statistics
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))

from helpers.sdn import SdnPool  # noqa: E402
from helpers.wan_traffic import tcp_upload, udp_upload, wan_rx_bytes  # noqa: E402

log = logging.getLogger("bench.wan_groups")
RATE = int(os.environ.get("WAN_BENCH_RATE", "50"))       # Mbit/s per group
SECONDS = int(os.environ.get("WAN_BENCH_SECONDS", "8"))
RUNS = int(os.environ.get("WAN_BENCH_RUNS", "3"))
HEADERS = 0.956                                          # TCP payload / wire bytes of a full-size frame


def measure(mechanism: str) -> dict:
    """TCP runs and one UDP run through the controller with `[wan] mechanism = mechanism`."""
    with tempfile.TemporaryDirectory() as tmp:
        groups = (f'[[wan_group]]\nname = "cms"\nselect = \'AcctGroup =?= "cms"\'\nrate_mbit = {RATE}\n'
                  f'[wan]\nmechanism = "{mechanism}"\novsdb = "unix:{tmp}/ovs/db.sock"\n')
        pool = SdnPool(tmp, policies=groups)
        try:
            pool.start()
            for name, n in (("c1", 10), ("c2", 11)):
                pool.add_job(name, "ep1", name, n, group="cms")
                code, body = pool.register(name)
                if code != 200:
                    raise RuntimeError(f"{mechanism}: job {name} not registered: {body}\n{pool.log()}")
            tcp = []
            for i in range(RUNS):
                tcp.append(tcp_upload(pool, ["c1", "c2"], SECONDS, base_port=5401 + 2 * i))
                log.info("%s TCP run %d: %s", mechanism, i + 1, tcp[-1])
            before = wan_rx_bytes(pool)
            udp_upload(pool, ["c1", "c2"], RATE, SECONDS)
            udp = (wan_rx_bytes(pool) - before) * 8 / SECONDS / 1e6
            counted = pool.api("GET", "/v1/status", cert="controller")[1]["wan_groups"][0]["bytes"]
        finally:
            pool.close()
    return {"tcp": tcp, "udp": udp, "counted": counted}


def main() -> int:
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    if os.geteuid() != 0:
        log.error("bench/wan_groups.py needs root (namespaces, OVS)")
        return 2
    res = {"meter": measure("meter"), "queue": measure("queue")}
    names = {"meter": "OpenFlow meter (policing)", "queue": "queue, htb (shaping)"}
    print(f"WAN group limit {RATE} Mbit/s, {SECONDS} s per run, {RUNS} TCP runs per mechanism, private OVS userspace "
          f"datapath, shared 2-core machine; TCP expected {RATE * HEADERS:.1f} Mbit/s (x 0.956 headers)")
    print(f"{'case':<40} {'job 1':>7} {'job 2':>7} {'sum':>7} {'sum/expected':>12} {'low/high':>9}")
    key = {}
    for mech in ("meter", "queue"):
        r = res[mech]
        for i, (a, b) in enumerate(r["tcp"]):
            print(f"{'TCP run ' + str(i + 1) + ', ' + names[mech]:<40} {a:>7.1f} {b:>7.1f} {a + b:>7.1f} "
                  f"{(a + b) / (RATE * HEADERS):>12.3f} {min(a, b) / max(a, b):>9.2f}")
        print(f"{'UDP 2 x ' + str(RATE) + ' offered, ' + names[mech]:<40} {'':>7} {'':>7} {r['udp']:>7.1f} "
              f"{r['udp'] / RATE:>12.3f}")
        print(f"{'  bytes the controller counted':<40} {r['counted']:>34}")
        p = "police" if mech == "meter" else "shape"
        key[f"{p}_tcp_ratio"] = statistics.mean(sum(x) for x in r["tcp"]) / (RATE * HEADERS)
        key[f"{p}_tcp_share"] = statistics.mean(min(x) / max(x) for x in r["tcp"])
        key[f"{p}_udp_ratio"] = r["udp"] / RATE
    order = ("police_tcp_ratio", "shape_tcp_ratio", "police_tcp_share", "shape_tcp_share", "police_udp_ratio",
             "shape_udp_ratio")
    print(" ".join(f"{k}={key[k]:.3f}" for k in order))
    return 0


if __name__ == "__main__":
    sys.exit(main())
