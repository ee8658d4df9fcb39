"""Bridge mode on the real kernel: jobs are stations on the world's network, with their own addresses."""
import json
import os
import time

import pytest

from helpers.fakehost import HOST_IP, WORLD_IP, sh
from helpers.waits import assert_transfers_limited, finished, wait_ready

BRIDGE_CFG = dict(default_network_type="bridge", bridge_name="lkbr0", bridge_uplink="up0",
                  bridge_range="198.51.100.100-198.51.100.149", bridge_prefix=24, bridge_gateway=WORLD_IP)


@pytest.fixture
def bhost(fakehost_factory):
    return fakehost_factory(**BRIDGE_CFG)


def test_bridged_job_has_its_own_address_on_the_world_network(bhost):
    cp = bhost.run_job("slot1", ["whoami", WORLD_IP, "7000"], job_ad="ClusterId = 31\nProcId = 0")
    assert cp.returncode == 0, cp.stderr + bhost.larkd_log()
    seen = json.loads(cp.stdout)["seen_as"]
    assert seen.startswith("198.51.100.1") and seen not in (HOST_IP, WORLD_IP), seen
    # The host kept its address: it moved from the uplink to the bridge.
    addrs = sh(bhost.in_host(["ip", "-o", "-4", "addr", "show", "dev", "lkbr0"])).stdout
    assert HOST_IP in addrs
    assert bhost.wait_clean() == {k: [] for k in bhost.residue()}


def test_bridged_download_counted(bhost):
    size = 8_000_000
    (bhost.www / "8M.bin").write_bytes(os.urandom(size))
    cp = bhost.run_job("slot1", ["download", f"http://{WORLD_IP}:8000/8M.bin"], job_ad="ClusterId = 32\nProcId = 0")
    assert cp.returncode == 0, cp.stderr + bhost.larkd_log()
    s = finished(bhost, "32.0")
    l3 = s["link_bytes_in"] - 14 * s["link_packets_in"]
    assert abs(s["bytes_in"] - l3) / l3 < 0.005, s
    assert size <= s["bytes_in"] < size * 1.05


def test_bridged_job_cannot_spoof_ip_or_mac(bhost):
    p = bhost.spawn_job("slot1", ["listen", "9000", "120"], job_ad="ClusterId = 33\nProcId = 0",)   # killed below
    j = wait_ready(bhost, "slot1")
    ns = j["netns"]
    # Root in the job's netns (what a job never is) changes its address and MAC: the bridge drops both.
    sh(["ip", "-n", ns, "addr", "add", "198.51.100.160/24", "dev", "eth0"])
    probe = ["ip", "netns", "exec", ns, "python3", "-c",
             "import socket,sys; s=socket.socket(); s.settimeout(2); s.bind((sys.argv[1],0));"
             "print(s.connect_ex((sys.argv[2],7000)))"]
    assert sh([*probe, j["plan"]["ipv4"], WORLD_IP], check=False).stdout.strip() == "0"
    assert sh([*probe, "198.51.100.160", WORLD_IP], check=False).stdout.strip() != "0"
    sh(["ip", "-n", ns, "link", "set", "eth0", "address", "02:00:00:00:00:99"])
    assert sh([*probe, j["plan"]["ipv4"], WORLD_IP], check=False).stdout.strip() != "0"
    bhost.end_job(p, j["netns"])
    assert bhost.wait_clean() == {k: [] for k in bhost.residue()}


def test_bridged_job_without_inbound_refuses_new_connections(bhost):
    # Its listener is up all along (a short one could have timed out on a loaded machine, and a refused
    # connection then would prove nothing)
    p = bhost.spawn_job("slot2", ["listen", "9000", "120"], job_ad="ClusterId = 34\nProcId = 0")
    j = wait_ready(bhost, "slot2")
    assert json.loads(p.stdout.readline())["listening"] == 9000
    cp = sh(bhost.in_world(["python3", "-c", "import socket,sys; s=socket.socket(); s.settimeout(2);"
                            "print(s.connect_ex((sys.argv[1],9000)))", j["plan"]["ipv4"]]), check=False)
    assert cp.stdout.strip() != "0", cp.stdout
    bhost.end_job(p, j["netns"])


def test_bridged_job_with_inbound_accepts_connections_on_its_own_address(bhost):
    p = bhost.spawn_job("slot3", ["listen", "9000", "60"],
                        job_ad="ClusterId = 35\nProcId = 0\nInboundConnectivity = true")
    j = wait_ready(bhost, "slot3")
    deadline, got = time.time() + 30, ""
    while time.time() < deadline and "hello" not in got:
        got = sh(bhost.in_world(["python3", "-c", "import socket,sys\ntry:\n s=socket.create_connection("
                                 "(sys.argv[1],9000),1); print(s.recv(100).decode())\nexcept OSError as e: print(e)",
                                 j["plan"]["ipv4"]]), check=False).stdout
        time.sleep(0.2)
    assert "hello from job" in got
    p.communicate(timeout=30)


def test_bridge_mode_limits_apply(bhost):
    assert_transfers_limited(bhost, "slot4", 36, 30, WORLD_IP)



def test_bridge_mode_refused_with_iptables(fakehost_factory):
    host = fakehost_factory(firewall="iptables", **BRIDGE_CFG)
    cp = host.run_job("slot1", ["env"], job_ad="ClusterId = 37\nProcId = 0")
    assert cp.returncode == 111
    assert "needs the nftables firewall backend" in cp.stderr
    assert host.wait_clean() == {k: [] for k in host.residue()}
