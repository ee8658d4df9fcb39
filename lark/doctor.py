"""`lark doctor`: which kernel and tool features Lark needs or can use, probed in a scratch namespace."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

from pyroute2 import IPRoute

# (feature, required, what it is for)
FEATURES = [
    ("netns", True, "one network namespace per job"),
    ("veth", True, "the job's link to the host"),
    ("nftables", False, "NAT, isolation and counters (default firewall backend)"),
    ("iptables", False, "the same through iptables (firewall = iptables)"),
    ("bridge", False, "bridge mode"),
    ("bridge_vlan_filtering", False, "per-job VLANs in bridge mode (else use ovs_bridge for VLANs)"),
    ("nft_bridge", False, "bridge mode anti-spoofing and counters (nftables bridge family)"),
    ("bridge_conntrack", False, "stateful filtering of bridged frames (Lark filters in the job's netns instead)"),
    ("tc_htb", False, "rate limits, both directions (host-side veth and the job's eth0)"),
    ("tc_tbf", False, "rate limit toward the job"),
    ("tc_ingress", False, "rate limit from the job (with ifb)"),
    ("ifb", False, "rate limit from the job"),
    ("act_police", False, "OVS ingress policing"),
    ("openvswitch_kernel", False, "OVS kernel datapath"),
    ("ovs_userspace", False, "OVS userspace (netdev) datapath"),
    ("dnsmasq", False, "DHCP server for tests and the testbed"),
]


def _run(argv: list[str]) -> bool:
    try:
        return subprocess.run(argv, capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def probe() -> dict[str, bool]:
    """Runs inside a fresh netns (see `run`), so nothing it creates touches the host."""
    r: dict[str, bool] = {"netns": True}
    with IPRoute() as ipr:
        def try_link(name: str, **kw) -> bool:
            try:
                ipr.link("add", ifname=name, **kw)
                return True
            except Exception:
                return False
        r["veth"] = try_link("dr0", kind="veth", peer={"ifname": "dr1"})
        r["bridge"] = try_link("drbr", kind="bridge")
        r["ifb"] = try_link("drifb", kind="ifb")
        r["bridge_vlan_filtering"] = try_link("drbrv", kind="bridge", br_vlan_filtering=1)
        if r["veth"]:
            idx = ipr.link_lookup(ifname="dr0")[0]
            ipr.link("set", index=idx, state="up")
    r["tc_htb"] = _run(["tc", "qdisc", "add", "dev", "dr0", "root", "handle", "1:", "htb"])
    _run(["tc", "qdisc", "del", "dev", "dr0", "root"])
    r["tc_tbf"] = _run(["tc", "qdisc", "add", "dev", "dr0", "root", "tbf", "rate", "1mbit", "burst", "32k",
                        "latency", "50ms"])
    r["tc_ingress"] = _run(["tc", "qdisc", "add", "dev", "dr0", "ingress"])
    r["act_police"] = r["tc_ingress"] and _run(["tc", "filter", "add", "dev", "dr0", "parent", "ffff:", "protocol",
                                                "all", "u32", "match", "u32", "0", "0", "police", "rate", "1mbit",
                                                "burst", "10k", "drop"])
    r["nftables"] = _run(["nft", "add", "table", "inet", "lark_doctor"])
    r["nft_bridge"] = _run(["nft", "add table bridge lark_doctor; add chain bridge lark_doctor c "
                                   "{ type filter hook forward priority 0; }"])
    r["bridge_conntrack"] = r["nft_bridge"] and _run(["nft", "add rule bridge lark_doctor c ct state established "
                                                     "accept"])
    r["iptables"] = _run(["iptables", "-w", "5", "-t", "filter", "-N", "LARK-DOCTOR"])
    r["openvswitch_kernel"] = os.path.isdir("/sys/module/openvswitch") or _run(["modprobe", "-n", "openvswitch"])
    r["ovs_userspace"] = bool(shutil.which("ovs-vswitchd") and shutil.which("ovsdb-server"))
    r["dnsmasq"] = bool(shutil.which("dnsmasq"))
    return r


def run() -> dict[str, bool]:
    # -P and cwd "/": `python -m` would otherwise put the current directory first on sys.path, and an admin
    # running `lark doctor` (as root) from a directory holding a `lark/` package would run that code.
    cp = subprocess.run(["unshare", "--net", sys.executable, "-P", "-m", "lark.doctor", "--probe"],
                        capture_output=True, text=True, timeout=60, cwd="/")
    if cp.returncode != 0:
        return {name: False for name, _, _ in FEATURES}
    return json.loads(cp.stdout)


def report(results: dict[str, bool], firewall: str = "nftables") -> tuple[str, int]:
    lines = [f"{'feature':<22} {'status':<9} {'needed':<9} use"]
    missing = 0
    for name, required, use in FEATURES:
        required = required or name == firewall
        ok = results.get(name, False)
        if required and not ok:
            missing += 1
        lines.append(f"{name:<22} {'ok' if ok else 'MISSING':<9} {'required' if required else 'optional':<9} {use}")
    ovs = ("kernel" if results.get("openvswitch_kernel") else
           "userspace (netdev)" if results.get("ovs_userspace") else "unavailable")
    lines.append(f"OVS datapath: {ovs}")
    return "\n".join(lines), missing


if __name__ == "__main__" and "--probe" in sys.argv:
    print(json.dumps(probe()))
