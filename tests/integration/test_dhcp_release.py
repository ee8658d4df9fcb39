"""Issue 23 item 12: a job speaks DHCP to the site's server itself.

A job process (uid 65534, no capabilities) sends DHCP client messages from an ordinary UDP socket, from its own
address and an unprivileged port, to the server's port 67 (547 for DHCPv6): a DHCPRELEASE for its own lease (the
server frees an address the job goes on using, and its next holder collides), a REQUEST that takes an address for
a client that does not exist, a DHCPv6 Solicit. Only larkd's own DHCP messages may leave a job's network: larkd's
socket carries a mark no job can set, dhcpcd's comes from port 546 no job can bind, and the filter in the job's own
netns (which the job cannot change) drops the rest (lark/kernel/firewall/job_netns.py).

The real dnsmasq in the world is the witness: its lease file, and its log up to a probe sent after the job's
messages (dnsmasq handles what reaches it in order, so the probe's line tells the job's messages would be logged).
"""
import json
import os
import secrets
import shutil
import signal
import struct
import time

import pytest
from helpers.fakehost import PY, WORLD_IP, sh
from helpers.waits import wait_ready
from test_dhcp import BASE, DHCP_AD, messages, start_dnsmasq
from test_ipv6 import world_v6
from test_site_dhcpv6 import BRIDGED, RANGE

from lark.kernel import dhcp, dhcp6
from lark.kernel.sections import Dhcp6Section

# What the job runs: waits for the test's messages (family, address, port, hex payload per line), sends each from
# an ordinary UDP socket, says how each send went, then keeps running (and using its address) until told to end.
JOB = r"""
import json, os, socket, sys, time
d = sys.argv[1]
deadline = time.time() + 60
while not os.path.exists(d + "/go") and time.time() < deadline:
    time.sleep(0.05)
results = []
for line in open(d + "/go").read().split():
    family, address, port, payload = line.split(",")
    s = socket.socket(socket.AF_INET6 if family == "6" else socket.AF_INET, socket.SOCK_DGRAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_BROADCAST, 1)
    try:
        s.sendto(bytes.fromhex(payload), (address, int(port)))
        results.append("sent")
    except OSError as e:
        results.append(os.strerror(e.errno))
with open(d + "/sent.tmp", "w") as f:
    json.dump(results, f)
os.rename(d + "/sent.tmp", d + "/sent")
while not os.path.exists(d + "/done") and time.time() < deadline:
    time.sleep(0.05)
"""
FAKE_MAC = "02:00:5e:10:20:30"


def exchange_dir(host):
    d = host.tmp / "job-dhcp"
    d.mkdir()
    os.chmod(d, 0o777)  # the job runs as uid 65534
    return d


def job_sends(host, d, messages_: list[tuple[str, str, int, bytes]]) -> list[str]:
    """Hand the job its messages; how each send went, as the job saw it."""
    (d / "go.tmp").write_text("\n".join(f"{f},{a},{p},{m.hex()}" for f, a, p, m in messages_))
    os.rename(d / "go.tmp", d / "go")
    deadline = time.time() + 20
    while not (d / "sent").exists() and time.time() < deadline:
        time.sleep(0.05)
    return json.loads((d / "sent").read_text())


def probe_server(host, log) -> None:
    """A DISCOVER from the EP host itself (root, its own address), after the job's messages: once dnsmasq has
    logged it, it has handled whatever of the job's messages reached it."""
    mac = "02:00:5e:" + ":".join(f"{b:02x}" for b in secrets.token_bytes(3))
    packet = dhcp.build(dhcp.DISCOVER, secrets.randbits(32), mac)
    code = ("import socket,sys; s=socket.socket(socket.AF_INET, socket.SOCK_DGRAM); "
            "s.sendto(bytes.fromhex(sys.argv[1]), (sys.argv[2], 67))")
    sh(host.in_host([PY, "-c", code, packet.hex(), WORLD_IP]))
    deadline = time.time() + 10
    while time.time() < deadline and not [m for m in messages(log, "DISCOVER") if mac in m]:
        time.sleep(0.05)
    assert [m for m in messages(log, "DISCOVER") if mac in m], log.read_text()


def leases(host) -> str:
    path = host.tmp / "dnsmasq.leases"
    return path.read_text() if path.exists() else ""


def spawn_attacker(host, slot, cluster, machine_ad=DHCP_AD, job_ad="", timeout=15):
    d = exchange_dir(host)
    ad = f"ClusterId = {cluster}\nProcId = 0\n{job_ad}"
    host.publish_ad(slot, ad, machine_ad)
    p = host.spawn_job(slot, ["run", "python3", "-c", JOB, str(d)], job_ad=ad)
    return p, d, wait_ready(host, slot, timeout=timeout)


def end_job(host, p, d):
    (d / "done").touch()
    out, err = p.communicate(timeout=30)
    assert p.returncode == 0, err + host.larkd_log()
    assert json.loads(out.strip().splitlines()[-1])["rc"] == 0, out
    assert host.wait_clean() == {k: [] for k in host.residue()}


def dhcp_host(fakehost_factory, mode: str, firewall: str = "nftables"):
    extra = dict(ovs=True, ovs_uplink="up0", ovs_datapath="netdev") if mode == "ovs_bridge" else {}
    if mode == "ovs_bridge" and not shutil.which("ovs-vswitchd"):
        pytest.skip("Open vSwitch is not installed")
    host = fakehost_factory(default_network_type=mode, firewall=firewall, **BASE, **extra)
    host.dnsmasq_log = start_dnsmasq(host)
    return host


@pytest.mark.parametrize("mode,firewall", [("bridge", "nftables"), ("ovs_bridge", "iptables")])
def test_a_job_cannot_release_its_own_lease_and_keep_the_address(fakehost_factory, mode, firewall):
    host = dhcp_host(fakehost_factory, mode, firewall)
    p, d, j = spawn_attacker(host, "slot1", 81)
    lease = j["plan"]["dhcp"]
    own = lease["address"]
    mac = json.loads(sh(["ip", "-n", j["netns"], "-j", "link", "show", "eth0"]).stdout)[0]["address"]
    assert own in leases(host)
    # What any job can build: its MAC, its address, its owner (the client identifier's input) and the server.
    release = dhcp.build(dhcp.RELEASE, secrets.randbits(32), mac, ciaddr=own, server=lease["server"],
                         broadcast=False, owner=lease["owner"])
    sent = job_sends(host, d, [("4", lease["server"], 67, release)])
    probe_server(host, host.dnsmasq_log)
    # dnsmasq writes its lease file before it reads the next message (the probe).
    assert own in leases(host), f"the job ({sent}) released its lease {own}, which it still uses:\n{leases(host)}"
    assert messages(host.dnsmasq_log, "RELEASE") == []
    assert sent == ["Operation not permitted"]
    end_job(host, p, d)


@pytest.mark.parametrize("mode,firewall", [("ovs_bridge", "nftables"), ("nat", "iptables")])
def test_a_job_cannot_take_an_address_for_another_client(fakehost_factory, mode, firewall):
    """The site's server, unicast and broadcast (NAT: unicast, through the EP's address): a REQUEST for an
    address of the range on behalf of a client that does not exist."""
    host = dhcp_host(fakehost_factory, mode, firewall)
    p, d, _ = spawn_attacker(host, "slot1", 82, DHCP_AD if mode != "nat" else "")
    want = "198.51.100.190"
    request = dhcp.build(dhcp.REQUEST, secrets.randbits(32), FAKE_MAC, requested=want)
    to = [("4", WORLD_IP, 67, request)] + ([("4", "255.255.255.255", 67, request)] if mode != "nat" else [])
    sent = job_sends(host, d, to)
    probe_server(host, host.dnsmasq_log)
    assert FAKE_MAC not in leases(host) and want not in leases(host), f"the job ({sent}) took {want}:\n{leases(host)}"
    assert not [m for m in messages(host.dnsmasq_log, "REQUEST") if FAKE_MAC in m], f"the job ({sent}) was heard"
    assert sent == ["Operation not permitted"] * len(to)
    end_job(host, p, d)


def solicit(duid: bytes) -> bytes:
    """A DHCPv6 Solicit: client identifier, elapsed time, one IA_NA."""
    def option(code: int, data: bytes) -> bytes:
        return struct.pack("!HH", code, len(data)) + data
    return (b"\x01" + secrets.token_bytes(3) + option(1, duid) + option(8, b"\0\0")
            + option(3, struct.pack("!III", 7, 0, 0)))


@pytest.mark.skipif(shutil.which("dhcpcd") is None, reason="dhcpcd is not installed (dhcpcd-base)")
def test_a_job_cannot_speak_dhcpv6_to_the_site_server(fakehost_factory):
    host = fakehost_factory(default_network_type="bridge", **BRIDGED)
    world_v6(host, with_host_address=False)
    pid, log = host.tmp / "dhcp6-server.pid", host.tmp / "dhcp6-server.log"
    sh(host.in_world(["sysctl", "-qw", "net.ipv6.conf.all.forwarding=1", "net.ipv6.conf.w0.accept_dad=0"]))
    sh(host.in_world(["dnsmasq", "--conf-file=/dev/null", f"--pid-file={pid}", "--port=0", "--interface=w0",
                      "--bind-interfaces", "--enable-ra", f"--dhcp-range={RANGE[0]},{RANGE[1]},64,1h",
                      f"--dhcp-leasefile={host.tmp / 'dhcp6.leases'}", "--ra-param=w0,4,1800", "--log-dhcp",
                      f"--log-facility={log}"]))
    try:
        p, d, _ = spawn_attacker(host, "slot1", 83, 'IPProtocol = "IPv4+IPv6"', 'IPProtocol = "IPv6"', timeout=25)
        duid = b"\x00\x03\x00\x01" + bytes.fromhex(FAKE_MAC.replace(":", ""))
        sent = job_sends(host, d, [("6", "ff02::1:2%eth0", 547, solicit(duid))])
        # The job's dhcpcd renews (SIGUSR1) on the same path, after the job's message: its Renew logged, the
        # server has handled what of the job's reached it.
        renewals = log.read_text().count("DHCPRENEW")
        os.kill(dhcp6.running_pid(Dhcp6Section.from_config(host.cfg), "slot1"), signal.SIGUSR1)
        deadline = time.time() + 10
        while time.time() < deadline and log.read_text().count("DHCPRENEW") == renewals:
            time.sleep(0.1)
        assert log.read_text().count("DHCPRENEW") > renewals, log.read_text()
        assert FAKE_MAC not in log.read_text(), f"the job ({sent}) was heard:\n{log.read_text()}"
        assert sent == ["Operation not permitted"]
        end_job(host, p, d)
    finally:
        sh(["kill", pid.read_text().strip()], check=False)
