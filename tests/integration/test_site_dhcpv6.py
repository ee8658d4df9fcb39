"""Issue 17.3: IPv6 by DHCPv6 for bridged and OVS jobs, through dhcpcd run by larkd in the job's netns.

The fake site network (the world) runs dnsmasq as DHCPv6 server for 2001:db8:ffff::100-1ff, with router
advertisements carrying the managed flag (the routes). A job gets a leased address from that range, reaches a site
server with it and with nothing else; its dhcpcd renews through the job's inbound filter, does not touch the host's
resolv.conf, and is gone with the job's network. Without a server, the job fails with a clear error.
"""
import ipaddress
import json
import os
import shutil
import signal
import time

import pytest

from helpers.fakehost import WORLD_IP, sh
from helpers.waits import wait_for, wait_ready
from test_ipv6 import WORLD6, job, world_v6

from lark.kernel import dhcp6
from lark.kernel.sections import Dhcp6Section

RANGE = (ipaddress.IPv6Address("2001:db8:ffff::100"), ipaddress.IPv6Address("2001:db8:ffff::1ff"))
BRIDGED = dict(bridge_uplink="up0", ovs_bridge_name="lkovs0", bridge_range="198.51.100.100-198.51.100.149",
               bridge_gateway=WORLD_IP, bridge_ipv6="dhcpv6")
PROBE = ["python3", "-c", "import socket,sys; s=socket.socket(socket.AF_INET6); s.settimeout(2);"
         "s.bind((sys.argv[1],0)); print(s.connect_ex((sys.argv[2],7006)))"]

pytestmark = pytest.mark.skipif(shutil.which("dhcpcd") is None, reason="dhcpcd is not installed (dhcpcd-base)")


def in_range(addr: str) -> bool:
    return RANGE[0] <= ipaddress.IPv6Address(addr) <= RANGE[1]


def dhcpcd_pids_in(netns_inode: int) -> list[int]:
    """Every dhcpcd process (manager or privilege-separation helper) sitting in the given netns."""
    out = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if open(f"/proc/{pid}/comm").read().strip() == "dhcpcd" and \
                    os.stat(f"/proc/{pid}/ns/net").st_ino == netns_inode and \
                    open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] != "Z":
                out.append(int(pid))
        except OSError:
            continue
    return out


def mode_params(mode: str) -> dict:
    if mode == "ovs_bridge":
        if not shutil.which("ovs-vswitchd"):
            pytest.skip("Open vSwitch is not installed")
        return dict(ovs=True, ovs_uplink="up0", ovs_datapath="netdev")
    return {}


@pytest.fixture(params=["bridge", "ovs_bridge"])
def site6(request, fakehost_factory):
    mode = request.param
    host = fakehost_factory(default_network_type=mode, **BRIDGED, **mode_params(mode))
    world_v6(host, with_host_address=False)
    pid, log = host.tmp / "dhcp6-server.pid", host.tmp / "dhcp6-server.log"
    # A router's link-local address is settled; the fake one would redo DAD (1-2 s, during which its RAs are
    # ignored) whenever the first job's bridge takes the uplink and w0's carrier blinks.
    sh(host.in_world(["sysctl", "-qw", "net.ipv6.conf.all.forwarding=1", "net.ipv6.conf.w0.accept_dad=0"]))
    sh(host.in_world(["dnsmasq", "--conf-file=/dev/null", f"--pid-file={pid}", "--port=0", "--interface=w0",
                      "--bind-interfaces", "--enable-ra", f"--dhcp-range={RANGE[0]},{RANGE[1]},64,1h",
                      f"--dhcp-leasefile={host.tmp / 'dhcp6.leases'}", "--dhcp-option=option6:dns-server,[::1]",
                      "--ra-param=w0,4,1800", "--log-dhcp", f"--log-facility={log}"]))
    yield mode, host
    sh(["kill", open(pid).read().strip()], check=False)


def test_job_gets_a_dhcpv6_lease_and_reaches_the_site_with_it(site6):
    mode, host = site6
    resolv_before = open("/etc/resolv.conf", "rb").read()
    cp = job(host, "slot1", 201, "IPv6", ["whoami", WORLD6, "7006"])
    assert cp.returncode == 0, cp.stderr + host.larkd_log()
    seen = json.loads(cp.stdout)["seen_as"]
    assert in_range(seen), seen
    assert "leased %s/128 by DHCPv6" % seen in host.larkd_log()
    # The server's DNS option went nowhere: dhcpcd's hooks never ran.
    assert open("/etc/resolv.conf", "rb").read() == resolv_before
    assert host.wait_clean() == {k: [] for k in host.residue()}
    assert not os.path.exists(dhcp6.job_dir(Dhcp6Section.from_config(host.cfg), "slot1"))


def test_dhcpv6_job_cannot_spoof_renews_and_leaves_no_client(site6):
    mode, host = site6
    ad = 'ClusterId = 202\nProcId = 0\nIPProtocol = "IPv6"'
    host.publish_ad("slot1", ad, 'IPProtocol = "IPv4+IPv6"')
    p = host.spawn_job("slot1", ["sleep", "120"], job_ad=ad)   # ended below
    v = wait_ready(host, "slot1")
    own, ns = v["plan"]["ipv6"], v["netns"]
    assert in_range(own), v["plan"]
    inode = os.stat(os.path.join(host.cfg.netns_dir, ns)).st_ino
    assert dhcp6.running_pid(Dhcp6Section.from_config(host.cfg), "slot1") in dhcpcd_pids_in(inode)
    assert sh(["ip", "netns", "exec", ns, *PROBE, own, WORLD6], check=False).stdout.strip() == "0"
    # Root in the job's netns (what a job never is) takes another address of the range: dropped at the port.
    other = str(RANGE[1] - 1 if ipaddress.IPv6Address(own) != RANGE[1] - 1 else RANGE[1] - 2)
    sh(["ip", "-n", ns, "addr", "add", f"{other}/64", "dev", "eth0", "nodad"])
    assert sh(["ip", "netns", "exec", ns, *PROBE, other, WORLD6], check=False).stdout.strip() != "0"
    # A renewal (SIGUSR1 to dhcpcd) is answered, and the answer passes the job's inbound filter: dhcpcd rewrites
    # its lease file (whose mtime is when the lease was granted) only on a valid reply.
    lease = os.path.join(dhcp6.job_dir(Dhcp6Section.from_config(host.cfg), "slot1"), "db", "eth0.lease6")
    granted = os.stat(lease).st_mtime_ns
    server_log = host.tmp / "dhcp6-server.log"
    renewals = open(server_log).read().count("DHCPRENEW")
    time.sleep(0.05)
    os.kill(dhcp6.running_pid(Dhcp6Section.from_config(host.cfg), "slot1"), signal.SIGUSR1)
    wait_for(lambda: os.stat(lease).st_mtime_ns != granted)
    assert open(server_log).read().count("DHCPRENEW") > renewals
    section = Dhcp6Section.from_config(host.cfg)
    assert os.stat(lease).st_mtime_ns > granted, open(dhcp6.log_path(section, "slot1")).read()
    assert sh(["ip", "netns", "exec", ns, *PROBE, own, WORLD6], check=False).stdout.strip() == "0"
    host.end_job(p, ns)
    assert host.wait_clean() == {k: [] for k in host.residue()}
    assert wait_for(lambda: dhcpcd_pids_in(inode) == []), dhcpcd_pids_in(inode)
    assert not os.path.exists(dhcp6.job_dir(Dhcp6Section.from_config(host.cfg), "slot1"))


def test_no_dhcpv6_server_means_a_clear_error(fakehost_factory):
    host = fakehost_factory(default_network_type="bridge", **BRIDGED, dhcpv6_timeout=2.0)
    cp = job(host, "slot1", 203, "IPv6", ["whoami", WORLD6, "7006"])
    assert cp.returncode != 0
    assert "no DHCPv6 lease" in cp.stderr and "203.0" in cp.stderr, cp.stderr
    assert host.wait_clean() == {k: [] for k in host.residue()}
    assert not os.path.exists(dhcp6.job_dir(Dhcp6Section.from_config(host.cfg), "slot1"))
