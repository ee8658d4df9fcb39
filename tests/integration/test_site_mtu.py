"""Issue 17.2: the job's link MTU follows the network behind it (1450 overlay uplinks, 9000 jumbo frames).

The fake EP's uplink (and the world's end of it) runs at the site's MTU before the first job; a job then moves
a large TCP transfer each way and a large UDP datagram, in NAT, bridge and OVS mode.
"""
import json
import os
import shutil
import subprocess

import pytest

from helpers.sites import MODES
from helpers.fakehost import WORLD_IP, sh

ECHO_PORT = 7712
# A UDP echo server in the world: answers every datagram with its length (reassembled, if it came in pieces).
ECHO = ("import socket\ns=socket.socket(socket.AF_INET,socket.SOCK_DGRAM); s.bind(('0.0.0.0',%d))\n"
        "while True:\n d,a=s.recvfrom(65535); s.sendto(str(len(d)).encode(),a)" % ECHO_PORT)


def _site(fakehost_factory, mode: str, site_mtu: int, **extra):
    if mode == "ovs_bridge" and not shutil.which("ovs-vswitchd"):
        pytest.skip("Open vSwitch is not installed")
    host = fakehost_factory(**MODES[mode], **extra)
    sh(host.in_host(["ip", "link", "set", "up0", "mtu", str(site_mtu)]))
    sh(host.in_world(["ip", "link", "set", "w0", "mtu", str(site_mtu)]))
    host.procs.append(subprocess.Popen(host.in_world(["python3", "-c", ECHO])))
    return host


def _run(host, slot, cluster, workload):
    cp = host.run_job(slot, workload, job_ad=f"ClusterId = {cluster}\nProcId = 0")
    assert cp.returncode == 0, cp.stderr + host.larkd_log()
    return json.loads(cp.stdout)


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("site_mtu", [1450, 9000])
def test_job_link_follows_the_site_mtu_and_large_packets_pass(fakehost_factory, mode, site_mtu):
    host = _site(fakehost_factory, mode, site_mtu)
    assert _run(host, "slot1", 181, ["mtu", "eth0"])["mtu"] == site_mtu
    # The largest datagram that fits the path unfragmented (DF set), and one that must be fragmented.
    largest = site_mtu - 28
    assert _run(host, "slot1", 182, ["udp-size", WORLD_IP, str(ECHO_PORT), str(largest), "df"]) == {"echoed": largest}
    assert _run(host, "slot1", 183, ["udp-size", WORLD_IP, str(ECHO_PORT), "20000"]) == {"echoed": 20000}
    size = 8_000_000
    (host.www / "8M.bin").write_bytes(os.urandom(size))
    assert _run(host, "slot1", 184, ["download", f"http://{WORLD_IP}:8000/8M.bin"]) == {"downloaded": size}
    got = _run(host, "slot1", 185, ["upload", WORLD_IP, "7001", str(size)])
    assert got["server_counted"] == size, got
    if mode == "bridge":
        # A jumbo uplink stays jumbo: the job's port did not pull the bridge (the host's address) down to 1500.
        assert f"mtu {site_mtu} " in sh(host.in_host(["ip", "link", "show", "lkbr0"])).stdout
    assert host.wait_clean() == {k: [] for k in host.residue()}


def test_configured_mtu_overrides_the_uplink(fakehost_factory):
    host = _site(fakehost_factory, "bridge", 9000, job_mtu=4000)
    assert _run(host, "slot1", 186, ["mtu", "eth0"])["mtu"] == 4000
    got = _run(host, "slot1", 187, ["udp-size", WORLD_IP, str(ECHO_PORT), "3972", "df"])
    assert got == {"echoed": 3972}
    # Above the configured MTU with DF set, the job's own stack refuses: nothing is sent that could be lost.
    assert "error" in _run(host, "slot1", 188, ["udp-size", WORLD_IP, str(ECHO_PORT), "3973", "df"])
