"""Issue 23 item 8: an OVS job whose addresses the site gave it (DHCP, SLAAC) cannot open connections to the EP host.

OVS jobs reach the host through the bridge's internal port (lkovs0), where the host's input hook cannot see which
switch port a frame came from. The guard used to know jobs by source address in `bridge_range`/`bridge_range6`,
so a job addressed by the site's DHCP server (outside bridge_range) or by SLAAC (no bridge_range6 at all) was not
a job to it. One dual-stack job (DHCPv4 from a site server, IPv6 by SLAAC from the site's router) tries a service
listening on the host's addresses on lkovs0, in both families; the same service answers the site (so it listens
and the host takes connections), and the job reaches the site (so its network works).
"""
import ipaddress
import os
import shutil
import signal
import subprocess

import pytest
from helpers.fakehost import HOST_IP, WORLD_IP, sh
from helpers.waits import wait_ready
from test_ipv6 import HOST6, WORLD6, world_v6

pytestmark = pytest.mark.skipif(not shutil.which("ovs-vswitchd"), reason="Open vSwitch is not installed")

SITE_DHCP = ("198.51.100.150", "198.51.100.199")   # the site's DHCP pool, outside bridge_range
PREFIX6 = ipaddress.IPv6Network("2001:db8:ffff::/64")
SERVICE_PORT = 9500
# A host service on every address of both families (a dual-stack socket).
SERVICE = ("import socket\ns = socket.socket(socket.AF_INET6)\n"
           "s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)\n"
           f"s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind(('::', {SERVICE_PORT})); s.listen(16)\n"
           "print('ready', flush=True)\nwhile True:\n    s.accept()[0].close()\n")
CONNECT = ("import socket,sys; s=socket.socket(socket.AF_INET6 if ':' in sys.argv[2] else socket.AF_INET);"
           "s.settimeout(2); s.bind((sys.argv[1],0)); print(s.connect_ex((sys.argv[2],int(sys.argv[3]))))")


@pytest.fixture
def site_addressed(fakehost_factory):
    """An OVS EP whose site network hands out both families itself: DHCPv4 and router advertisements."""
    host = fakehost_factory(ovs=True, default_network_type="ovs_bridge", ovs_bridge_name="lkovs0", ovs_uplink="up0",
                            ovs_datapath="netdev", bridge_range="198.51.100.100-198.51.100.149", bridge_prefix=24,
                            bridge_gateway=WORLD_IP, bridge_ipv6="slaac")
    world_v6(host, with_host_address=False)
    pid = host.tmp / "site-dhcp.pid"
    sh(host.in_world(["sysctl", "-qw", "net.ipv6.conf.all.forwarding=1"]))
    # The host's own IPv6 is set by hand on the bridge below; autoconfigured on up0 (an OVS port once the bridge
    # takes it), it would route the host's replies out of a port with no neighbours.
    sh(host.in_host(["sysctl", "-qw", "net.ipv6.conf.up0.accept_ra=0"]))
    sh(host.in_world(["dnsmasq", "--conf-file=/dev/null", f"--pid-file={pid}", "--port=0", "--interface=w0",
                      "--bind-interfaces", "--no-ping", f"--dhcp-leasefile={host.tmp / 'site.leases'}",
                      f"--dhcp-range={SITE_DHCP[0]},{SITE_DHCP[1]},255.255.255.0,2m", f"--dhcp-option=3,{WORLD_IP}",
                      "--enable-ra", f"--dhcp-range={PREFIX6.network_address},ra-only,64", "--ra-param=w0,4,1800"]))
    service = subprocess.Popen(host.in_host(["python3", "-c", SERVICE]), stdout=subprocess.PIPE, text=True)
    host.procs.append(service)
    assert service.stdout.readline().strip() == "ready"
    yield host
    sh(["kill", pid.read_text().strip()], check=False)


def guard_set(host) -> str:
    return sh(host.in_host(["nft", "list", "set", "inet", host.cfg.nft_table, "ovs_jobs"])).stdout


def connect(argv_prefix: list[str], src: str, dst: str, port: int) -> str:
    return sh([*argv_prefix, "python3", "-c", CONNECT, src, dst, str(port)], check=False).stdout.strip()


def test_ovs_job_with_site_given_addresses_cannot_reach_host_services(site_addressed):
    host = site_addressed
    ad = 'ClusterId = 231\nProcId = 0\nIPProtocol = "IPv4+IPv6"'
    host.publish_ad("slot1", ad, 'AddressType = "dhcp"\nIPProtocol = "IPv4+IPv6"')
    p = host.spawn_job("slot1", ["sleep", "30"], job_ad=ad)
    j = wait_ready(host, "slot1", timeout=25)
    ns, ip4, ip6 = j["netns"], j["plan"]["ipv4"], j["plan"]["ipv6"]
    # The premise: addresses the guard's old source ranges never named.
    assert ipaddress.IPv4Address(SITE_DHCP[0]) <= ipaddress.IPv4Address(ip4) <= ipaddress.IPv4Address(SITE_DHCP[1])
    assert ipaddress.IPv6Address(ip6) in PREFIX6, j["plan"]
    # The host's addresses on the site network sit on the OVS bridge's internal port (IPv4 moved there by larkd).
    sh(host.in_host(["ip", "addr", "add", f"{HOST6}/64", "dev", host.cfg.ovs_bridge_name, "nodad"]))
    in_job, in_world = ["ip", "netns", "exec", ns], host.in_world([])
    assert connect(in_job, ip4, WORLD_IP, 7000) == "0"                        # the job's network works
    assert connect(in_job, ip6, WORLD6, 7006) == "0"
    assert connect(in_world, WORLD_IP, HOST_IP, SERVICE_PORT) == "0"          # the service answers the site
    assert connect(in_world, WORLD6, HOST6, SERVICE_PORT) == "0"
    # The attack, both families.
    reached = {"IPv4": connect(in_job, ip4, HOST_IP, SERVICE_PORT) == "0",
               "IPv6": connect(in_job, ip6, HOST6, SERVICE_PORT) == "0"}
    assert reached == {"IPv4": False, "IPv6": False}
    for pid in sh(["ip", "netns", "pids", ns]).stdout.split():   # the job ends (its starter then exits)
        os.kill(int(pid), signal.SIGKILL)
    p.communicate(timeout=30)
    assert host.wait_clean() == {k: [] for k in host.residue()}
    assert "elements" not in guard_set(host)   # the job's MAC left the guard with it
