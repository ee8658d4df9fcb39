"""IPv6 and dual stack on the real kernel: NAT66, routed /128s without DAD, bridged addresses, anti-spoofing."""
import json
import subprocess

import pytest

from helpers.fakehost import HOST_IP, WORLD_IP, sh
from helpers.waits import finished, wait_ready

WORLD6, HOST6 = "2001:db8:ffff::1", "2001:db8:ffff::2"
NAT6 = dict(subnet6="fd00:213::/64")
MACHINE = 'IPProtocol = "IPv4+IPv6"'
WHOAMI6 = ("import socket\ns = socket.socket(socket.AF_INET6); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
           "s.bind(('::', 7006)); s.listen(16); print('ready', flush=True)\n"
           "while True:\n    c, a = s.accept(); c.sendall((a[0] + '\\n').encode()); c.close()\n")


def world_v6(host, with_host_address=True):
    """IPv6 on the world link, and a who-am-I server on [::]:7006 in the world."""
    sh(host.in_world(["ip", "addr", "add", f"{WORLD6}/64", "dev", "w0", "nodad"]))
    if with_host_address:
        sh(host.in_host(["ip", "addr", "add", f"{HOST6}/64", "dev", "up0", "nodad"]))
        sh(host.in_host(["ip", "-6", "route", "add", "default", "via", WORLD6]))
    p = subprocess.Popen(host.in_world(["python3", "-c", WHOAMI6]), stdout=subprocess.PIPE, text=True)
    host.procs.append(p)
    assert p.stdout.readline().strip() == "ready"


def job(host, slot, cluster, proto, workload):
    ad = f'ClusterId = {cluster}\nProcId = 0\nIPProtocol = "{proto}"'
    host.publish_ad(slot, ad, MACHINE)
    return host.run_job(slot, workload, job_ad=ad)


def test_dual_stack_nat_job_is_masqueraded_in_both_families(fakehost_factory):
    host = fakehost_factory(**NAT6)
    world_v6(host)
    cp = job(host, "slot1", 81, "IPv4+IPv6", ["whoami", WORLD6, "7006"])
    assert cp.returncode == 0, cp.stderr + host.larkd_log()
    assert json.loads(cp.stdout)["seen_as"] == HOST6          # NAT66
    cp = job(host, "slot1", 82, "IPv4+IPv6", ["whoami", WORLD_IP, "7000"])
    assert json.loads(cp.stdout)["seen_as"] == HOST_IP
    cp = job(host, "slot1", 83, "IPv4+IPv6", ["env"])
    env = json.loads(cp.stdout)
    assert env["LARK_IPV6_ADDRESS"].startswith("fd00:213::") and env["LARK_IPV4_ADDRESS"].startswith("10.213.0.")
    assert finished(host, "81.0")["bytes_in"] > 0
    assert host.wait_clean() == {k: [] for k in host.residue()}


def test_ipv6_only_job_has_no_ipv4(fakehost_factory):
    host = fakehost_factory(**NAT6)
    world_v6(host)
    cp = job(host, "slot2", 84, "IPv6", ["whoami", WORLD6, "7006"])
    assert cp.returncode == 0, cp.stderr + host.larkd_log()
    assert json.loads(cp.stdout)["seen_as"] == HOST6
    cp = job(host, "slot2", 85, "IPv6", ["connect", WORLD_IP, "7000"])
    r = json.loads(cp.stdout)
    assert r["connected"] is False and "unreachable" in r["error"].lower(), r


def test_ipv6_source_spoofing_dropped(fakehost_factory):
    host = fakehost_factory(**NAT6)
    world_v6(host)
    ad = 'ClusterId = 86\nProcId = 0\nIPProtocol = "IPv4+IPv6"'
    host.publish_ad("slot3", ad, MACHINE)
    p = host.spawn_job("slot3", ["listen", "9000", "120"], job_ad=ad)   # killed below
    j = wait_ready(host, "slot3")
    ns, own = j["netns"], j["plan"]["ipv6"]
    sh(["ip", "-n", ns, "addr", "add", "fd00:213::ffff/128", "dev", "eth0", "nodad"])
    probe = ["ip", "netns", "exec", ns, "python3", "-c",
             "import socket,sys; s=socket.socket(socket.AF_INET6); s.settimeout(2); s.bind((sys.argv[1],0));"
             "print(s.connect_ex((sys.argv[2],7006)))"]
    assert sh([*probe, own, WORLD6], check=False).stdout.strip() == "0"
    assert sh([*probe, "fd00:213::ffff", WORLD6], check=False).stdout.strip() != "0"
    host.end_job(p, ns)


@pytest.mark.parametrize("mode", ["bridge", "ovs_bridge"])
def test_bridged_job_gets_its_own_ipv6_address(fakehost_factory, mode):
    extra = dict(ovs=True, ovs_uplink="up0", ovs_datapath="netdev") if mode == "ovs_bridge" else {}
    host = fakehost_factory(default_network_type=mode, bridge_uplink="up0", ovs_bridge_name="lkovs0",
                            bridge_range="198.51.100.100-198.51.100.149", bridge_gateway=WORLD_IP,
                            bridge_range6="2001:db8:ffff::100-2001:db8:ffff::1ff", bridge_gateway6=WORLD6, **extra)
    world_v6(host, with_host_address=False)
    cp = job(host, "slot4", 87, "IPv4+IPv6", ["whoami", WORLD6, "7006"])
    assert cp.returncode == 0, cp.stderr + host.larkd_log()
    seen = json.loads(cp.stdout)["seen_as"]
    assert seen.startswith("2001:db8:ffff::1") and seen != WORLD6, seen
    assert host.wait_clean() == {k: [] for k in host.residue()}


def test_ipv6_wanted_but_not_configured_is_a_clear_error(host):
    cp = job(host, "slot5", 88, "IPv6", ["env"])
    assert cp.returncode == 111
    assert "wants IPv6" in cp.stderr and "SUBNET6" in cp.stderr
    assert host.wait_clean() == {k: [] for k in host.residue()}
