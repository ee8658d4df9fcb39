"""SciTags on the real kernel: flow labels seen on the wire in the world netns, fireflies at a test collector.

A tagged and an untagged job each choose a flow label of their own (IPV6_FLOWLABEL_MGR + IPV6_FLOWINFO_SEND, what an
unprivileged process may do) and try to delete Lark's marking table, then upload over IPv6 (NAT66) to the world.
The untagged job's label must arrive as it chose it (so the tagged job's attempt would work without Lark's rule);
the tagged job's must carry Lark's 15 tag bits.
"""
import ipaddress
import json
import os
import socket
import subprocess
import threading
from pathlib import Path

import jsonschema

from helpers.fakehost import JOB_PY, WORLD_IP, sh
from helpers.waits import finished, wait_ready
from lark import scitags
from lark.kernel import netns

WORLD6, HOST6 = "2001:db8:ffff::1", "2001:db8:ffff::2"
SINK6_PORT = 7016
COLLECTOR_PORT = 10514
TAG = (2, 3)          # ATLAS, an activity id; the rule below gives it to AcctGroup "group_atlas"
SIZE = 4_000_000
SCHEMA = json.loads((Path(__file__).parent.parent / "helpers" / "firefly.schema.json").read_text())
VALIDATOR = jsonschema.Draft202012Validator(SCHEMA, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER)
SINK6 = ("import socket\ns = socket.socket(socket.AF_INET6); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
         f"s.bind(('::', {SINK6_PORT})); s.listen(16); print('ready', flush=True)\n"
         "while True:\n    c, a = s.accept(); n = 0\n    while True:\n        b = c.recv(1 << 16)\n"
         "        if not b: break\n        n += len(b)\n    c.sendall(b'%d\\n' % n); c.close()\n")
# The job's own attempts: delete Lark's table (it has no CAP_NET_ADMIN in its netns), then send with a label of its
# choosing. struct in6_flowlabel_req: dst, label, action GET (0), share EXCL (1), flags CREATE (1), expires,
# linger, pad.
JOB = """import socket, struct, subprocess, sys
host, port, size, label = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4], 0)
nft = subprocess.run(["nft", "delete", "table", "inet", "lark_scitags"], capture_output=True)
s = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
req = socket.inet_pton(socket.AF_INET6, host) + struct.pack("!I", label) + struct.pack("=BBHHHI", 0, 1, 1, 0, 0, 0)
s.setsockopt(socket.IPPROTO_IPV6, 32, req)   # IPV6_FLOWLABEL_MGR
s.setsockopt(socket.IPPROTO_IPV6, 33, 1)     # IPV6_FLOWINFO_SEND
s.connect((host, port, label, 0))
buf, sent = b"x" * 65536, 0
while sent < size:
    sent += s.send(buf[:size - sent])
s.shutdown(socket.SHUT_WR)
got = int(s.recv(100))
sys.stderr.write("src=%s nft_rc=%d got=%d" % (s.getsockname()[0], nft.returncode, got))
sys.exit(0 if got == size else 3)
"""


class WireCapture:
    """IPv6 TCP packets on the world's end of the uplink (a packet socket in the world netns): their flow labels."""

    def __init__(self, world_ns: str):
        fd = os.open(f"/run/netns/{world_ns}", os.O_RDONLY)
        try:
            with netns.entered(fd):
                self.sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(0x86DD))
                self.sock.bind(("w0", 0))
        finally:
            os.close(fd)
        self.sock.settimeout(0.2)
        self.labels: dict[tuple[str, int], set[int]] = {}   # (source, source port) -> labels seen
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        while not self.stop.is_set():
            try:
                frame = self.sock.recv(256)
            except TimeoutError:
                continue
            ip = frame[14:]
            if len(ip) < 44 or ip[0] >> 4 != 6 or ip[6] != socket.IPPROTO_TCP:
                continue
            label = int.from_bytes(ip[1:4], "big") & 0xFFFFF
            src = str(ipaddress.IPv6Address(ip[8:24]))
            sport, dport = int.from_bytes(ip[40:42], "big"), int.from_bytes(ip[42:44], "big")
            if dport == SINK6_PORT:
                self.labels.setdefault((src, sport), set()).add(label)

    def close(self):
        self.stop.set()
        self.thread.join(5)
        self.sock.close()


def collector(world_ns: str) -> socket.socket:
    fd = os.open(f"/run/netns/{world_ns}", os.O_RDONLY)
    try:
        with netns.entered(fd):
            s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            s.bind((WORLD_IP, COLLECTOR_PORT))
    finally:
        os.close(fd)
    s.settimeout(3)
    return s


def fireflies(sock: socket.socket) -> list[dict]:
    out = []
    try:
        while True:
            data = sock.recv(65536)
            msg = scitags.firefly_of_datagram(data)
            VALIDATOR.validate(msg)
            assert data.startswith(b"<134>1 "), data[:40]   # the RFC 5424 header collectors parse first
            out.append(msg)
    except TimeoutError:
        return out


def run_job(host, slot, cluster, group, label):
    ad = f'ClusterId = {cluster}\nProcId = 0\nIPProtocol = "IPv6"\nAcctGroup = "{group}"'
    host.publish_ad(slot, ad, 'IPProtocol = "IPv4+IPv6"')
    cp = host.run_job(slot, ["run", JOB_PY, "-c", JOB, WORLD6, str(SINK6_PORT), str(SIZE), hex(label)], job_ad=ad)
    assert cp.returncode == 0, cp.stderr + host.larkd_log()
    result = json.loads(cp.stdout)
    assert result["rc"] == 0, result
    fields = dict(kv.split("=") for kv in result["stderr"].split())
    assert fields["nft_rc"] != "0", "the job deleted Lark's marking table"
    return fields


def test_tagged_flows_carry_the_tag_untagged_keep_theirs_and_fireflies_report_them(fakehost_factory):
    host = fakehost_factory(subnet6="fd00:213::/64", scitags=f'{TAG[0]} {TAG[1]} AcctGroup == "group_atlas"',
                            scitags_collector=f"{WORLD_IP}:{COLLECTOR_PORT}")
    sh(host.in_world(["ip", "addr", "add", f"{WORLD6}/64", "dev", "w0", "nodad"]))
    sh(host.in_host(["ip", "addr", "add", f"{HOST6}/64", "dev", "up0", "nodad"]))
    sh(host.in_host(["ip", "-6", "route", "add", "default", "via", WORLD6]))
    sink = subprocess.Popen(host.in_world(["python3", "-c", SINK6]), stdout=subprocess.PIPE, text=True)
    host.procs.append(sink)
    assert sink.stdout.readline().strip() == "ready"
    wire, ffs = WireCapture(host.world_ns), collector(host.world_ns)
    # Labels the jobs pick: another experiment/activity (7, 9) with entropy bits 01 / 1 / 11; bit 19 clear, as the
    # kernel keeps the upper half of the label space for stateless labels (flowlabel_state_ranges).
    chosen = int("01" + f"{7:09b}"[::-1] + "1" + f"{9:06b}" + "11", 2)
    try:
        untagged = run_job(host, "slot1", 301, "group_other", chosen)
        tagged = run_job(host, "slot2", 302, "group_atlas", chosen)
        tagged_figures = finished(host, "302.0")
        finished(host, "301.0")
        messages = fireflies(ffs)
    finally:
        wire.close()
        ffs.close()

    # On the wire (after NAT66 the source is the host's address; flows are told apart by source port).
    flows = {sport: labels for (src, sport), labels in wire.labels.items() if src == HOST6}
    assert len(flows) == 2, wire.labels
    as_chosen = [p for p, labels in flows.items() if labels == {chosen}]
    assert len(as_chosen) == 1, f"the untagged job's label was changed: {flows}"
    (tagged_port,) = set(flows) - set(as_chosen)
    for label in flows[tagged_port]:
        assert scitags.tag_of_label(label) == TAG, f"{label:#07x} carries {scitags.tag_of_label(label)}"
        assert label & scitags.ENTROPY_MASK == chosen & scitags.ENTROPY_MASK   # the socket's entropy bits stay

    # Fireflies: the tagged job's one flow, start and end, from its side; none for the untagged job.
    assert {(m["context"]["experiment-id"], m["context"]["activity-id"]) for m in messages} == {TAG}, messages
    assert [m["flow-lifecycle"]["state"] for m in messages] == ["start", "end"], messages
    start, end = messages
    assert start["flow-id"] == end["flow-id"] == {
        "afi": "ipv6", "src-ip": tagged["src"], "dst-ip": WORLD6, "protocol": "tcp",
        "src-port": end["flow-id"]["src-port"], "dst-port": SINK6_PORT}
    assert untagged["src"] != tagged["src"]
    usage, counted = end["usage"], tagged_figures
    assert usage["sent"] > SIZE and usage["received"] > 0
    assert abs(usage["sent"] - counted["bytes_out"]) <= 0.01 * counted["bytes_out"], (usage, counted)
    assert abs(usage["received"] - counted["bytes_in"]) <= 0.01 * counted["bytes_in"], (usage, counted)
    assert host.wait_clean() == {k: [] for k in host.residue()}


def test_verify_reports_a_tagged_jobs_marking_table_removed_by_hand(fakehost_factory):
    host = fakehost_factory(scitags=f'{TAG[0]} {TAG[1]} true')
    host.spawn_job("slot1", ["sleep", "60"], job_ad="ClusterId = 303\nProcId = 0")
    job = wait_ready(host, "slot1")
    assert host.lark("status", "--verify", check=False).returncode == 0
    sh(["ip", "netns", "exec", job["netns"], "nft", "delete", "table", "inet", "lark_scitags"])
    cp = host.lark("status", "--verify", "--json", check=False)
    assert cp.returncode == 1, cp.stdout + cp.stderr
    (row,) = json.loads(cp.stdout)["drift"]
    assert "lark_scitags" in row["object"] and "not tagged" in row["problem"], row
