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
    ("nftables", False, "NAT, isolation and counters through libnftables (default firewall backend)"),
    ("iptables", False, "the same through iptables (firewall = iptables)"),
    ("tc_htb", False, "rate limits, both directions (host-side veth and the job's eth0)"),
    ("bridge", False, "bridge mode"),
    ("nft_bridge", False, "bridge mode anti-spoofing and counters (nftables bridge family)"),
    ("openvswitch_kernel", False, "OVS kernel datapath"),
    ("ovs_userspace", False, "OVS userspace (netdev) datapath"),
]


def _run(argv: list[str]) -> bool:
    try:
        return subprocess.run(argv, capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def _nft(cmd: str) -> bool:
    # Through libnftables, as the nftables backend does (the `nft` binary would not prove the library loads).
    from .errors import LarkError
    from .kernel.firewall import libnft
    try:
        return libnft.get().run(cmd)[0] == 0
    except LarkError:
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
        if r["veth"]:
            idx = ipr.link_lookup(ifname="dr0")[0]
            ipr.link("set", index=idx, state="up")
    r["tc_htb"] = _run(["tc", "qdisc", "add", "dev", "dr0", "root", "handle", "1:", "htb"])
    r["nftables"] = _nft("add table inet lark_doctor")
    r["nft_bridge"] = _nft("add table bridge lark_doctor; add chain bridge lark_doctor c "
                           "{ type filter hook forward priority 0; }")
    r["iptables"] = _run(["iptables", "-w", "5", "-t", "filter", "-N", "LARK-DOCTOR"])
    r["openvswitch_kernel"] = os.path.isdir("/sys/module/openvswitch") or _run(["modprobe", "-n", "openvswitch"])
    r["ovs_userspace"] = bool(shutil.which("ovs-vswitchd") and shutil.which("ovsdb-server"))
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
