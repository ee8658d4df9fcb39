"""Bridged modes through the real pool: bridge + DHCP (dnsmasq in the world), and OVS + VLAN (a private OVS)."""
import subprocess
import sys
import time

import pytest

from condor import as_root, history, job, out_of, submit, testbed

sys.path.insert(0, str(testbed.REPO / "tests"))
from helpers.ovs import PrivateOVS  # noqa: E402

pytestmark = pytest.mark.e2e
LARK_KNOBS = testbed.ROOT / "etc/condor/config.d/94-lark-bridged.conf"
POLICY = testbed.ROOT / "etc/condor/config.d/95-bridged.conf"
BRIDGED = """LARK_BRIDGE_NAME = lkbr0
LARK_BRIDGE_UPLINK = up0
LARK_BRIDGE_RANGE = 198.51.100.100-198.51.100.149
LARK_BRIDGE_GATEWAY = 198.51.100.1
LARK_OVS_BRIDGE_NAME = lkovs0
LARK_OVS_DB = unix:/run/lark-ovs/db.sock
LARK_OVS_RUNDIR = /run/lark-ovs
LARK_OVS_DATAPATH = netdev
"""


def restart_larkd():
    as_root(["condor_off", "-daemon", "LARKD"])
    deadline = time.time() + 60
    while time.time() < deadline and as_root(["lark", "status"]).returncode == 0:
        time.sleep(0.3)
    as_root(["condor_on", "-daemon", "LARKD"])
    while time.time() < deadline + 60 and as_root(["lark", "status"]).returncode != 0:
        time.sleep(0.3)
    assert as_root(["lark", "status"]).returncode == 0, "larkd did not come back"


def machine_policy(text):
    POLICY.write_text(text)
    as_root(["condor_reconfig"])
    time.sleep(3)


@pytest.fixture(scope="module")
def bridged_pool(pool, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("dnsmasq")
    ovs = PrivateOVS(str(testbed.ROOT / "run/lark-ovs"), testbed.HOST_NS)
    dnsmasq = subprocess.Popen(
        ["nsenter", f"--net=/run/netns/{testbed.WORLD_NS}", "dnsmasq", "--keep-in-foreground", "--no-ping",
         "--port=0", "--user=root", "--interface=w0", "--bind-interfaces", "--conf-file=/dev/null", "--pid-file=",
         "--dhcp-range=198.51.100.150,198.51.100.199,255.255.255.0,10m", f"--dhcp-leasefile={tmp}/leases",
         f"--dhcp-option=3,{testbed.WORLD_IP}", "--dhcp-authoritative"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        ovs.start()
        LARK_KNOBS.write_text(BRIDGED)
        restart_larkd()
        yield ovs
    finally:
        LARK_KNOBS.unlink(missing_ok=True)
        POLICY.unlink(missing_ok=True)
        ovs.close()
        dnsmasq.terminate()
        dnsmasq.wait(10)
        # The bridge took the EP's uplink: start the pool afresh for the tests that follow.
        testbed.stop()
        testbed.start()


def test_bridge_dhcp_job_downloads_with_its_own_leased_address(bridged_pool):
    machine_policy('NetworkType = "bridge"\nAddressType = "dhcp"\n')
    url = f"http://{testbed.WORLD_IP}:8000/10M.bin"
    script = f'import urllib.request; print(len(urllib.request.urlopen("{url}").read()))'
    c = submit("br-dhcp", job(args="-c '" + script.replace('"', '""') + "'"))
    mode, addr, inbytes, code = history(c, ["LarkNetworkType", "LarkIPv4Address", "NetworkIncomingBytes",
                                            "ExitCode"])
    assert (mode, code) == ("bridge", "0")
    assert 150 <= int(addr.rsplit(".", 1)[1]) <= 199, addr  # from dnsmasq's range, not Lark's static one
    assert out_of("br-dhcp") == "10000000"
    assert int(inbytes) >= 10_000_000
    # The world's HTTP server saw the job's own address (no NAT in bridge mode).
    assert addr in (testbed.CACHE / "world.log").read_text()


def test_ovs_vlan_job_gets_a_port_tagged_with_its_vlan(bridged_pool):
    """Isolation between VLANs is tested on the kernel (tests/integration/test_ovs.py); here the real pool's
    RequestedVLAN travels job ad -> matchmaking -> slot ad -> larkd -> the OVS access port's tag."""
    machine_policy('NetworkType = "ovs_bridge"\nAddressType = "static"\nVLAN = 100\n'
                   "STARTD_ATTRS = $(STARTD_ATTRS) VLAN\n")
    script = 'import os, socket, time; time.sleep(5); print(os.environ["LARK_IPV4_ADDRESS"], ' \
             'sorted(n for _, n in socket.if_nameindex()))'
    c = submit("ovs-vlan", job(args="-c '" + script.replace('"', '""') + "'",
                               extra="+RequestedVLAN = 100\nrequirements = TARGET.VLAN == MY.RequestedVLAN"))
    tag = ""
    deadline = time.time() + 90
    while time.time() < deadline and not tag:
        if "lkovs0" in bridged_pool.vsctl("list-br").split():
            ports = [p for p in bridged_pool.vsctl("list-ports", "lkovs0").split() if p.startswith("lk-")]
            if ports:
                tag = bridged_pool.vsctl("get", "port", ports[0], "tag").strip()
        time.sleep(0.3)
    assert tag == "100"
    mode, addr, code = history(c, ["LarkNetworkType", "LarkIPv4Address", "ExitCode"])
    assert (mode, code) == ("ovs_bridge", "0")
    assert out_of("ovs-vlan") == f"{addr} ['eth0', 'lo']"
