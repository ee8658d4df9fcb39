"""SciTags in the kernel: a tagged job's flow label, set in its own netns, and larkd's fireflies for its flows.

Marking: a table of its own in the job's netns (which belongs to the initial user namespace: the job has no
CAP_NET_ADMIN there, and no CAP_NET_RAW for a packet socket that would skip netfilter) rewrites the 15 tag bits of
every IPv6 packet the job sends, at the end of the output hook, after anything the job chose (IPV6_FLOWLABEL_MGR,
sin6_flowinfo). The 5 entropy bits stay as the sending socket made them: the kernel's per-flow hash
(net.ipv6.auto_flowlabels), as the specification asks. nftables (1.0.6) sets a payload field only to a constant,
so Lark cannot draw entropy bits itself without one rule per value; keeping the kernel's is also what a host
marking with flowd does. The same table, and so the marking, exists under either firewall backend.

Fireflies: the specification's messages are per flow (flow-id is a TCP/UDP 5-tuple), so larkd follows the job's
connection tracking in its netns: a "start" firefly when a flow is confirmed (conntrack NEW event), an "end" one
when its entry goes (DESTROY event, with the flow's byte counters: nf_conntrack_acct) or, for flows still tracked
when the job ends, from a dump just before the netns goes. Conntrack runs in a netns only while a rule there
uses it: with fireflies on, the table counts new flows.
"""
from __future__ import annotations

import ipaddress
import json
import logging
import os
import selectors
import socket
import threading
import time
from dataclasses import dataclass, field

from pyroute2.netlink.nfnetlink.nfctsocket import AsyncNFCTSocket, NFCTSocket
from pyroute2.netlink.nlsocket import Marshal

from .. import scitags
from ..errors import LarkError
from . import netns
from .drift import Finding, drifted, present
from .firewall import libnft

log = logging.getLogger(__name__)

TABLE = "lark_scitags"
NETLINK_NETFILTER = 12
# Legacy netlink group bits of ctnetlink (linux/netfilter/nfnetlink_compat.h): NF_NETLINK_CONNTRACK_NEW, _DESTROY.
CONNTRACK_NEW, CONNTRACK_DESTROY = 0x1, 0x4
IPCTNL_MSG_CT_NEW, IPCTNL_MSG_CT_DELETE = 0, 2
PROTOCOLS = {socket.IPPROTO_TCP: "tcp", socket.IPPROTO_UDP: "udp"}   # the firefly schema's protocol enum
# The flow label starts at bit 12 of the IPv6 header (after version and traffic class); label bit b is header bit
# 12 + 19 - b, so the experiment field (label bits 17..9) starts at header bit 14 and the activity (7..2) at 24.
EXPERIMENT_AT = 12 + 19 - (scitags.EXPERIMENT_SHIFT + scitags.EXPERIMENT_BITS - 1)
ACTIVITY_AT = 12 + 19 - (scitags.ACTIVITY_SHIFT + scitags.ACTIVITY_BITS - 1)


def rules(scitag: int, fireflies: bool) -> str:
    """The job netns's SciTags table: the tag bits on every IPv6 packet out; with fireflies, conntrack on."""
    experiment, activity = scitags.split(scitag)
    reversed_experiment = scitags.label_bits(experiment, 0) >> scitags.EXPERIMENT_SHIFT
    lines = [f"meta nfproto ipv6 @nh,{EXPERIMENT_AT},{scitags.EXPERIMENT_BITS} set {reversed_experiment:#x} "
             f"@nh,{ACTIVITY_AT},{scitags.ACTIVITY_BITS} set {activity:#x}"]
    if fireflies:
        lines.append("ct state new counter")
    body = "".join(f"    {line}\n" for line in lines)
    # Priority 300: after every other output chain of the netns, so nothing later rewrites the label.
    return (f"table inet {TABLE} {{\n  chain output {{\n    type filter hook output priority 300; policy accept;\n"
            f"{body}  }}\n}}\n")


def secure(ns_fd: int, job: str, scitag: int, fireflies: bool) -> None:
    """Mark the job's flows (before the job runs); with fireflies, conntrack counts bytes and times each flow."""
    if fireflies:
        for key in ("net.netfilter.nf_conntrack_acct", "net.netfilter.nf_conntrack_timestamp"):
            try:
                netns.write_sysctl_in(ns_fd, key, "1")
            except OSError as e:
                raise LarkError(f"cannot set {key} in the job's netns: {e}", job=job, obj="SciTags fireflies",
                                fix="load nf_conntrack (modprobe nf_conntrack), or set LARK_SCITAGS_COLLECTOR "
                                    "= \"\"") from None
    rc, _, err = libnft.run_in_netns(ns_fd, rules(scitag, fireflies))
    if rc != 0:
        raise LarkError(f"nft failed: {err.strip()[:300]}", job=job, obj=f"SciTags flow label {scitag} in the "
                        "job's netns", fix="check that nftables works in the job's netns (lark doctor)")


def verify(ns_fd: int, scitag: int, fireflies: bool) -> list[Finding]:
    """The table `secure` made, read back: present, with as many rules."""
    what = f"nft table inet {TABLE} (SciTags flow label) in the job's netns"
    fix = "something other than larkd ran nft in the job's netns (the job itself cannot: no CAP_NET_ADMIN there)"
    rc, out, _ = libnft.run_in_netns(ns_fd, f"list table inet {TABLE}")
    if rc != 0:
        return [drifted(what, "the table is gone: the job's flows are not tagged", fix)]
    have = sum(1 for o in json.loads(out).get("nftables", []) if "rule" in o)
    want = 2 if fireflies else 1
    return [present(what) if have == want else drifted(what, f"{have} rule(s) where setup put {want}", fix)]


@dataclass
class _Watched:
    key: str
    job_id: str
    scitag: int
    addresses: frozenset[str]           # the job's own addresses: which side of a flow is the job's
    sock: socket.socket
    ns_fd: int
    started: dict[int, float] = field(default_factory=dict)   # conntrack id -> start time, flows reported started
    lock: threading.Lock = field(default_factory=threading.Lock)  # the event thread and `finish` both read sock


class FireflyReporter:
    """larkd's fireflies for every tagged job: one thread reading each job's conntrack events, UDP to the collector.

    A failure to send is logged and never touches the job: fireflies are reports, the marking stays."""

    def __init__(self, collector: tuple[str, int], hostname: str | None = None):
        host, port = collector
        family, _, _, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_DGRAM)[0]
        self.collector: tuple = address
        self.out = socket.socket(family, socket.SOCK_DGRAM)
        self.hostname = hostname or socket.gethostname()
        self.marshal = Marshal()
        self.marshal.msg_map.update(AsyncNFCTSocket.policy)
        self.jobs: dict[str, _Watched] = {}
        self.lock = threading.Lock()
        self.selector = selectors.DefaultSelector()
        self.wake_r, self.wake_w = socket.socketpair()
        self.selector.register(self.wake_r, selectors.EVENT_READ)
        self.thread = threading.Thread(target=self._run, name="fireflies", daemon=True)
        self.thread.start()

    # -- per job --------------------------------------------------------------------------------------
    def watch(self, key: str, job_id: str, ns_fd: int, scitag: int, addresses: set[str]) -> None:
        """Report the job's flows from now on (setup calls it before the job runs; larkd's restart again)."""
        with netns.entered(ns_fd):
            sock = socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, NETLINK_NETFILTER)
        sock.bind((0, CONNTRACK_NEW | CONNTRACK_DESTROY))
        sock.setblocking(False)
        own = frozenset(str(ipaddress.ip_address(a)) for a in addresses)   # conntrack's spelling of them
        w = _Watched(key, job_id, scitag, own, sock, os.dup(ns_fd))
        with self.lock:
            old = self.jobs.pop(key, None)
            self.jobs[key] = w
            self.selector.register(sock, selectors.EVENT_READ, key)
        if old:
            self._close(old)
        self.wake_w.send(b"x")

    def finish(self, key: str) -> int:
        """The job ends: end fireflies for the flows still tracked, then stop (before its netns goes: the socket
        would keep it alive). Returns how many end messages went out now."""
        with self.lock:
            w = self.jobs.pop(key, None)
            if w is None:
                return 0
            self.selector.unregister(w.sock)
        with w.lock:
            self._drain(w)
            return self._finish(w)

    def _finish(self, w: _Watched) -> int:
        sent = 0
        try:
            for family in (socket.AF_INET, socket.AF_INET6):
                with netns.entered(w.ns_fd):
                    nl = socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, NETLINK_NETFILTER)
                ct = NFCTSocket(nfgen_family=family, use_socket=nl)
                try:
                    for msg in ct.dump():
                        sent += self._report(w, msg, ending=True)
                finally:
                    ct.close()
        except OSError as e:
            log.error("job %s: could not read its remaining flows for SciTags end fireflies: %s", w.job_id, e)
        finally:
            self._close(w)
        return sent

    def close(self) -> None:
        for key in list(self.jobs):
            self.finish(key)
        self.wake_w.send(b"q")
        self.thread.join(5)
        self.out.close()

    # -- events ---------------------------------------------------------------------------------------
    def _run(self) -> None:
        while True:
            for sel, _ in self.selector.select():
                if sel.fileobj is self.wake_r:
                    if b"q" in self.wake_r.recv(64):
                        return
                    continue
                with self.lock:
                    w = self.jobs.get(sel.data)
                if w is not None:
                    with w.lock:
                        if w.sock.fileno() != -1:   # not finished meanwhile
                            self._drain(w)

    def _drain(self, w: _Watched) -> None:
        """Hold w.lock."""
        while True:
            try:
                data = w.sock.recv(1 << 16)
            except BlockingIOError:
                return
            except OSError as e:   # ENOBUFS: events were lost; later ones still come
                log.warning("job %s: conntrack events lost (%s); some fireflies will be missing", w.job_id, e)
                return
            for msg in self.marshal.parse(data):
                kind = msg["header"]["type"] & 0xFF
                if kind in (IPCTNL_MSG_CT_NEW, IPCTNL_MSG_CT_DELETE):
                    self._report(w, msg, ending=kind == IPCTNL_MSG_CT_DELETE)

    def _report(self, w: _Watched, msg, ending: bool) -> int:
        flow, job_sent_orig = self._flow(w, msg)
        if flow is None:
            return 0
        ct_id = msg.get_attr("CTA_ID")
        start_ns = msg.get_nested("CTA_TIMESTAMP", "CTA_TIMESTAMP_START")
        now = time.time()
        start = w.started.pop(ct_id, None) if ending else None
        if start is None:
            start = start_ns / 1e9 if start_ns else now
        if not ending:
            w.started[ct_id] = start
            self._send(w, scitags.firefly("start", flow, w.scitag, start, now))
            return 1
        stop_ns = msg.get_nested("CTA_TIMESTAMP", "CTA_TIMESTAMP_STOP")
        orig = msg.get_nested("CTA_COUNTERS_ORIG", "CTA_COUNTERS_BYTES") or 0
        reply = msg.get_nested("CTA_COUNTERS_REPLY", "CTA_COUNTERS_BYTES") or 0
        sent, received = (orig, reply) if job_sent_orig else (reply, orig)
        self._send(w, scitags.firefly("end", flow, w.scitag, start, now, end=stop_ns / 1e9 if stop_ns else now,
                                      sent=sent, received=received))
        return 1

    @staticmethod
    def _flow(w: _Watched, msg) -> tuple[scitags.Flow | None, bool]:
        """The flow with the job's side as source, and whether the job opened it (its bytes: the original
        direction); None for what the schema cannot name (not TCP/UDP) and flows inside the job's netns."""
        family = socket.AF_INET6 if msg["nfgen_family"] == socket.AF_INET6 else socket.AF_INET
        ip = "CTA_IP_V6" if family == socket.AF_INET6 else "CTA_IP_V4"
        orig = msg.get_attr("CTA_TUPLE_ORIG")
        if orig is None:
            return None, False
        proto = orig.get_nested("CTA_TUPLE_PROTO", "CTA_PROTO_NUM")
        src, dst = orig.get_nested("CTA_TUPLE_IP", f"{ip}_SRC"), orig.get_nested("CTA_TUPLE_IP", f"{ip}_DST")
        sport = orig.get_nested("CTA_TUPLE_PROTO", "CTA_PROTO_SRC_PORT")
        dport = orig.get_nested("CTA_TUPLE_PROTO", "CTA_PROTO_DST_PORT")
        if proto not in PROTOCOLS or not sport or not dport or (src in w.addresses) == (dst in w.addresses):
            return None, False
        if src in w.addresses:
            return scitags.Flow(family, PROTOCOLS[proto], src, sport, dst, dport), True
        return scitags.Flow(family, PROTOCOLS[proto], dst, dport, src, sport), False

    def _send(self, w: _Watched, msg: dict) -> None:
        try:
            self.out.sendto(scitags.datagram(msg, self.hostname, time.time()), self.collector)
        except OSError as e:
            log.warning("job %s: firefly to %s not sent: %s", w.job_id, self.collector, e)

    def _close(self, w: _Watched) -> None:
        w.sock.close()
        os.close(w.ns_fd)
