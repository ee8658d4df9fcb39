"""Issue 17.3: IPv6 autoconfiguration for bridged and OVS jobs from the site's router advertisements.

The fake site network (the world) runs dnsmasq in RA-only mode for 2001:db8:ffff::/64. A job gets the address
SLAAC gives its MAC, reaches the world with it and with nothing else; router advertisements from another job are
dropped, while the same advertisement from the uplink side is accepted (so the crafted RA itself is sound).
"""
import ipaddress
import json
import shutil

import pytest

from helpers.fakehost import WORLD_IP, sh
from helpers.waits import wait_for, wait_ready
from test_ipv6 import WORLD6, job, world_v6

PREFIX = ipaddress.IPv6Network("2001:db8:ffff::/64")
ROGUE = ipaddress.IPv6Network("2001:db8:bad::/64")
# One router advertisement with a prefix to autoconfigure (type 134; the kernel fills in the checksum).
SEND_RA = """import socket, struct, sys
prefix = socket.inet_pton(socket.AF_INET6, sys.argv[2])
ra = struct.pack("!BBHBBHII", 134, 0, 0, 64, 0, 0, 0, 0)
ra += struct.pack("!BBBBIII", 3, 4, 64, 0xC0, 3600, 3600, 0) + prefix
s = socket.socket(socket.AF_INET6, socket.SOCK_RAW, socket.IPPROTO_ICMPV6)
s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_MULTICAST_HOPS, 255)
s.sendto(ra, ("ff02::1", 0, 0, socket.if_nametoindex(sys.argv[1])))
"""


def eui64(mac: str) -> ipaddress.IPv6Address:
    b = bytes.fromhex(mac.replace(":", ""))
    iid = bytes([b[0] ^ 2]) + b[1:3] + b"\xff\xfe" + b[3:]
    return PREFIX[int.from_bytes(iid, "big")]


@pytest.fixture(params=["bridge", "ovs_bridge"])
def site6(request, fakehost_factory):
    mode = request.param
    if mode == "ovs_bridge" and not shutil.which("ovs-vswitchd"):
        pytest.skip("Open vSwitch is not installed")
    extra = dict(ovs=True, ovs_uplink="up0", ovs_datapath="netdev") if mode == "ovs_bridge" else {}
    host = fakehost_factory(default_network_type=mode, bridge_uplink="up0", ovs_bridge_name="lkovs0",
                            bridge_range="198.51.100.100-198.51.100.149", bridge_gateway=WORLD_IP,
                            bridge_ipv6="slaac", **extra)
    world_v6(host, with_host_address=False)
    pid = host.tmp / "radv.pid"
    sh(host.in_world(["sysctl", "-qw", "net.ipv6.conf.all.forwarding=1"]))
    sh(host.in_world(["dnsmasq", "--conf-file=/dev/null", f"--pid-file={pid}", "--port=0", "--interface=w0",
                      "--bind-interfaces", "--enable-ra", f"--dhcp-range={PREFIX.network_address},ra-only,64",
                      "--ra-param=w0,4,1800"]))
    yield mode, host
    sh(["kill", open(pid).read().strip()], check=False)


def test_job_gets_its_slaac_address_and_reaches_the_world_with_it(site6):
    mode, host = site6
    cp = job(host, "slot1", 191, "IPv6", ["whoami", WORLD6, "7006"])
    assert cp.returncode == 0, cp.stderr + host.larkd_log()
    seen = ipaddress.IPv6Address(json.loads(cp.stdout)["seen_as"])
    assert seen in PREFIX, seen
    from lark.names import JobNames, host_mac_seed
    mac = JobNames("slot1", host.cfg.netns_prefix, mac_seed=host_mac_seed(host.cfg.job_mac_seed)).job_mac
    assert seen == eui64(mac), seen
    assert host.wait_clean() == {k: [] for k in host.residue()}


def test_slaac_job_cannot_spoof_and_no_job_can_be_a_router(site6):
    mode, host = site6
    ad = 'ClusterId = 192\nProcId = 0\nIPProtocol = "IPv6"'
    host.publish_ad("slot1", ad, 'IPProtocol = "IPv4+IPv6"')
    victim = host.spawn_job("slot1", ["sleep", "120"], job_ad=ad)   # both ended below
    v = wait_ready(host, "slot1")
    ad2 = 'ClusterId = 193\nProcId = 0\nIPProtocol = "IPv6"'
    host.publish_ad("slot2", ad2, 'IPProtocol = "IPv4+IPv6"')
    rogue = host.spawn_job("slot2", ["sleep", "120"], job_ad=ad2)
    r = wait_ready(host, "slot2")
    own = v["plan"]["ipv6"]
    assert ipaddress.IPv6Address(own) in PREFIX, v["plan"]
    probe = ["python3", "-c", "import socket,sys; s=socket.socket(socket.AF_INET6); s.settimeout(2);"
             "s.bind((sys.argv[1],0)); print(s.connect_ex((sys.argv[2],7006)))"]
    assert sh(["ip", "netns", "exec", v["netns"], *probe, own, WORLD6], check=False).stdout.strip() == "0"
    # Root in the job's netns (what a job never is) takes another address of the prefix: dropped.
    sh(["ip", "-n", v["netns"], "addr", "add", "2001:db8:ffff::bad/64", "dev", "eth0", "nodad"])
    assert sh(["ip", "netns", "exec", v["netns"], *probe, "2001:db8:ffff::bad", WORLD6],
              check=False).stdout.strip() != "0"

    def victim_has_rogue_prefix():
        out = sh(["ip", "-n", v["netns"], "-6", "-o", "addr", "show", "dev", "eth0"]).stdout
        return str(ROGUE.network_address).rstrip(":") in out

    # Another job (with root in its netns) advertises a prefix: the bridge or switch drops it.
    sh(["ip", "netns", "exec", r["netns"], "python3", "-c", SEND_RA, "eth0", str(ROGUE.network_address)])
    import time
    time.sleep(1.5)
    assert not victim_has_rogue_prefix()
    # The same advertisement from the uplink side is taken: the RA was sound, the filter made the difference.
    sh(host.in_world(["python3", "-c", SEND_RA, "w0", str(ROGUE.network_address)]))
    assert wait_for(victim_has_rogue_prefix), "the uplink's advertisement was not taken"
    host.end_job(victim, v["netns"])
    host.end_job(rogue, r["netns"])


def test_no_router_means_a_clear_error(fakehost_factory):
    host = fakehost_factory(default_network_type="bridge", bridge_uplink="up0", bridge_range="198.51.100.100-198.51.100.149",
                            bridge_gateway=WORLD_IP, bridge_ipv6="slaac", slaac_timeout=1.0)
    cp = job(host, "slot1", 194, "IPv6", ["whoami", WORLD6, "7006"])
    assert cp.returncode != 0
    assert "no router advertisement" in cp.stderr and "194.0" in cp.stderr, cp.stderr
    assert host.wait_clean() == {k: [] for k in host.residue()}
