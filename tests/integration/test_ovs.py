"""Open vSwitch mode on the real kernel, with a private OVS (userspace datapath) inside the fake host."""
import json
import os
import shutil

import pytest

from helpers.fakehost import HOST_IP, WORLD_IP, sh
from helpers.waits import assert_transfers_limited, finished, wait_ready

pytestmark = pytest.mark.skipif(not shutil.which("ovs-vswitchd"), reason="Open vSwitch is not installed")
OVS_CFG = dict(ovs=True, default_network_type="ovs_bridge", ovs_bridge_name="lkovs0", ovs_uplink="up0",
               ovs_datapath="netdev", bridge_range="198.51.100.100-198.51.100.149", bridge_prefix=24,
               bridge_gateway=WORLD_IP)


@pytest.fixture
def ohost(fakehost_factory):
    return fakehost_factory(**OVS_CFG)


def connect(host, ns, src, dst, port):
    cp = sh(["ip", "netns", "exec", ns, "python3", "-c",
             "import socket,sys; s=socket.socket(); s.settimeout(2); s.bind((sys.argv[1],0));"
             "print(s.connect_ex((sys.argv[2],int(sys.argv[3]))))", src, dst, str(port)], check=False)
    return cp.stdout.strip()


def test_ovs_job_reaches_world_with_its_own_address_and_is_counted(ohost):
    size = 6_000_000
    (ohost.www / "6M.bin").write_bytes(os.urandom(size))
    cp = ohost.run_job("slot1", ["whoami", WORLD_IP, "7000"], job_ad="ClusterId = 41\nProcId = 0")
    assert cp.returncode == 0, cp.stderr + ohost.larkd_log()
    seen = json.loads(cp.stdout)["seen_as"]
    assert seen.startswith("198.51.100.1") and seen not in (HOST_IP, WORLD_IP), seen
    cp = ohost.run_job("slot1", ["download", f"http://{WORLD_IP}:8000/6M.bin"], job_ad="ClusterId = 42\nProcId = 0")
    assert cp.returncode == 0, cp.stderr + ohost.larkd_log()
    s = finished(ohost, "42.0")
    assert size <= s["bytes_in"] < size * 1.05, s
    assert ohost.wait_clean() == {k: [] for k in ohost.residue()}


def test_ovs_port_named_after_job_and_flows_removed_with_it(ohost):
    p = ohost.spawn_job("slot2", ["listen", "9000", "120"], job_ad="ClusterId = 43\nProcId = 0")   # killed below
    j = wait_ready(ohost, "slot2")
    assert j["host_if"] in ohost.ovs.vsctl("list-ports", "lkovs0").split()
    assert ohost.ovs.vsctl("get", "interface", j["host_if"], "external_ids:lark-job").strip() == '"43.0"'
    # drop-all, DHCP client, DHCP-server drop, own IPv4, own ARP
    assert sum("in_port" in f and j["host_if"] in f for f in ohost.ovs_flows()) == 5
    ohost.end_job(p, j["netns"])
    assert ohost.wait_clean() == {k: [] for k in ohost.residue()}


def test_ovs_job_cannot_spoof_ip_or_mac(ohost):
    p = ohost.spawn_job("slot3", ["listen", "9000", "120"], job_ad="ClusterId = 44\nProcId = 0")   # killed below
    j = wait_ready(ohost, "slot3")
    ns, ip = j["netns"], j["plan"]["ipv4"]
    assert connect(ohost, ns, ip, WORLD_IP, 7000) == "0"
    sh(["ip", "-n", ns, "addr", "add", "198.51.100.161/24", "dev", "eth0"])
    assert connect(ohost, ns, "198.51.100.161", WORLD_IP, 7000) != "0"
    sh(["ip", "-n", ns, "link", "set", "eth0", "address", "02:00:00:00:00:98"])
    sh(["ip", "-n", ns, "neigh", "flush", "all"])
    assert connect(ohost, ns, ip, WORLD_IP, 7000) != "0"
    ohost.end_job(p, j["netns"])


def test_vlans_separate_jobs(ohost):
    ads = {"slot4": 100, "slot5": 100, "slot6": 200}
    for slot, vlan in ads.items():
        ohost.publish_ad(slot, "", f"VLAN = {vlan}")
    jobs = {}
    for n, (slot, vlan) in enumerate(ads.items()):
        ad = f"ClusterId = {50 + n}\nProcId = 0\nRequestedVLAN = {vlan}\nInboundConnectivity = true"
        ohost.publish_ad(slot, ad, f"VLAN = {vlan}")
        jobs[slot] = ohost.spawn_job(slot, ["listen", "9000", "120"], job_ad=ad)   # up until killed below
        ohost.publish_ad(slot, ad, f"VLAN = {vlan}")
    info = {slot: wait_ready(ohost, slot) for slot in ads}
    tags = {slot: ohost.ovs.vsctl("get", "port", info[slot]["host_if"], "tag").strip() for slot in ads}
    assert tags == {"slot4": "100", "slot5": "100", "slot6": "200"}
    a, b, c = (info[s] for s in ("slot4", "slot5", "slot6"))
    for p in jobs.values():   # every listener is up: a refused connection is the VLAN's doing
        assert json.loads(p.stdout.readline())["listening"] == 9000
    assert connect(ohost, b["netns"], b["plan"]["ipv4"], a["plan"]["ipv4"], 9000) == "0"   # same VLAN
    assert connect(ohost, c["netns"], c["plan"]["ipv4"], b["plan"]["ipv4"], 9000) != "0"   # other VLAN
    for slot, p in jobs.items():
        ohost.end_job(p, info[slot]["netns"])
    assert ohost.wait_clean() == {k: [] for k in ohost.residue()}


def test_ovs_mode_limits_apply(ohost):
    assert_transfers_limited(ohost, "slot7", 60, 30, WORLD_IP)
