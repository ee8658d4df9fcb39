"""Issue 17.1, OVS mode: a site neighbour that spoofs a job's address from the uplink side cannot use the host's
DNS forwarder.

OVS jobs reach the forwarder through the bridge's internal port, where the host firewall knows them only by their
source MAC (issue 23 item 9: the set of MACs allowed DNS). A machine on the site network sends a DNS query to the
forwarder's address, with a running job's address and MAC as source, to the host's MAC on the bridge. The host's
resolver logs every query it gets: with Lark's uplink guard flow the spoofed query never arrives; with the flow
removed the same kind of query does (so the probe itself is sound and the flow is what stops it). The job's own
DNS keeps working.
"""
import json
import secrets
import shutil
import time

import pytest

from helpers.fakehost import sh
from helpers.sites import MODES
from helpers.waits import wait_ready
from test_site_dns import ANSWER, NAME, WORKLOAD, _kill_pidfile, resolv_dir  # noqa: F401 (fixture)

from lark.kernel.attach.ovs import UPLINK_GUARD_COOKIE

# One UDP DNS query in a hand-made Ethernet frame, so its source addresses (MAC and IP) can be anyone's.
SPOOF = r"""import socket, struct, sys
dev, dst_mac, src_mac, src_ip, dst_ip, name = sys.argv[1:7]
q = struct.pack(">HHHHHH", 0x1234, 0x0100, 1, 0, 0, 0) + b"".join(
    bytes([len(p)]) + p.encode() for p in name.split(".")) + b"\0" + struct.pack(">HH", 1, 1)
udp = struct.pack(">HHHH", 40000, 53, 8 + len(q), 0) + q
hdr = struct.pack(">BBHHHBBH4s4s", 0x45, 0, 20 + len(udp), 1, 0, 64, 17, 0,
                  socket.inet_aton(src_ip), socket.inet_aton(dst_ip))
csum = sum(struct.unpack(">10H", hdr))
csum = (csum & 0xFFFF) + (csum >> 16)
hdr = hdr[:10] + struct.pack(">H", ~((csum & 0xFFFF) + (csum >> 16)) & 0xFFFF) + hdr[12:]
s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
s.bind((dev, 0))
s.send(bytes.fromhex(dst_mac.replace(":", "")) + bytes.fromhex(src_mac.replace(":", "")) + b"\x08\x00" + hdr + udp)
"""


@pytest.fixture
def ovs_site(fakehost_factory, resolv_dir):
    if not shutil.which("ovs-vswitchd"):
        pytest.skip("Open vSwitch is not installed")
    resolv = resolv_dir / "resolv.conf"
    resolv.write_text("nameserver 127.0.0.53\n")
    resolv.chmod(0o644)
    host = fakehost_factory(resolv_conf=str(resolv), **MODES["ovs_bridge"])
    pid, log = host.tmp / "stub.pid", resolv_dir / "stub-queries.log"
    sh(host.in_host(["dnsmasq", "--conf-file=/dev/null", f"--pid-file={pid}", "--listen-address=127.0.0.53",
                     "--bind-interfaces", "--no-resolv", "--no-hosts", f"--address=/{NAME}/{ANSWER}",
                     "--log-queries", f"--log-facility={log}"]))
    yield host, log
    _kill_pidfile(str(pid))


def _arrives(host, log, bridge_mac: str, job_mac: str, job_ip: str) -> bool:
    """Send one spoofed query for a fresh name; True when the host's resolver got it (through the forwarder)."""
    name = f"spoof-{secrets.token_hex(4)}.lark-site.test"
    sh(host.in_world(["python3", "-c", SPOOF, "w0", bridge_mac, job_mac, job_ip, host.cfg.dns_address, name]))
    deadline = time.time() + 2
    while time.time() < deadline:
        if name in log.read_text():
            return True
        time.sleep(0.1)
    return False


def test_site_neighbour_spoofing_a_jobs_address_cannot_reach_the_forwarder(ovs_site):
    host, log = ovs_site
    p = host.spawn_job("slot1", ["sleep", "25"], job_ad="ClusterId = 185\nProcId = 0")
    j = wait_ready(host, "slot1")
    job_ip = j["plan"]["ipv4"]
    bridge_mac = json.loads(sh(host.in_host(["ip", "-j", "link", "show", host.cfg.ovs_bridge_name])).stdout)[0]["address"]
    job_mac = next(link["address"] for link in json.loads(sh(["ip", "-j", "-n", j["netns"], "link"]).stdout)
                   if link["ifname"] != "lo")
    guard = [f for f in host.ovs_flows() if "in_port=up0" in f and host.cfg.dns_address in f]
    assert len(guard) == 1 and "actions=drop" in guard[0], host.ovs_flows()
    # The job's own DNS through the forwarder works with the guard in place.
    q = sh(["ip", "netns", "exec", j["netns"], "setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
            "/usr/bin/python3", WORKLOAD, "resolve", NAME, "127.0.0.53"], check=False)
    assert json.loads(q.stdout).get("address") == ANSWER, q.stdout + q.stderr + host.larkd_log()
    assert not _arrives(host, log, bridge_mac, job_mac, job_ip)
    # Without the guard flow the same spoofed query reaches the host's resolver.
    sh(["ovs-ofctl", "del-flows", f"unix:{host.ovs.dir}/{host.cfg.ovs_bridge_name}.mgmt",
        f"cookie={UPLINK_GUARD_COOKIE}/-1"])
    assert _arrives(host, log, bridge_mac, job_mac, job_ip)
    p.kill()
    p.communicate(timeout=30)
