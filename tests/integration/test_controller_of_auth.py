"""Issue 26: the OpenFlow listener authenticates switches. Each attack is performed by a rogue "switch" (a socket that
speaks just enough OpenFlow 1.3 to be taken for a switch and never answers a barrier) next to the pool's real OVS
switch, while a job of an owner under a drop policy registers: it must still get its flows on the real switch."""
from __future__ import annotations

import os
import shutil
import socket
import ssl
import struct
import threading
import time

import pytest
from helpers.sdn import CORE_DPID, DROP_MALLORY, GW, SdnPool, started_pool
from os_ken.ofproto import ofproto_parser
from os_ken.ofproto import ofproto_v1_3 as of

from lark.controller import certs
from lark.kernel import netns as nsutil

pytestmark = pytest.mark.skipif(not shutil.which("ovs-vswitchd"), reason="Open vSwitch is not installed")

OTHER_DPID = 0xFF


@pytest.fixture
def pool(tmp_path):
    yield from started_pool(str(tmp_path), DROP_MALLORY)


class RogueSwitch(threading.Thread):
    """A "switch" claiming `dpid`: HELLO, a features reply, an empty port list, echo replies; nothing else is
    answered. `got` lists the OpenFlow message types the controller sent it; `closed` is set when it hung up."""

    def __init__(self, sock: socket.socket, dpid: int):
        super().__init__(daemon=True)
        self.sock, self.dpid = sock, dpid
        self.got: list[int] = []
        self.closed = threading.Event()

    def _send(self, msg_type: int, xid: int, body: bytes = b"") -> None:
        self.sock.sendall(struct.pack(of.OFP_HEADER_PACK_STR, of.OFP_VERSION, msg_type, of.OFP_HEADER_SIZE + len(body),
                                      xid) + body)

    def _recv_exactly(self, n: int) -> bytes:
        data = b""
        while len(data) < n:
            chunk = self.sock.recv(n - len(data))
            if not chunk:
                raise EOFError
            data += chunk
        return data

    def run(self) -> None:
        try:
            self._send(of.OFPT_HELLO, 1)
            while True:
                head = self._recv_exactly(of.OFP_HEADER_SIZE)
                _version, msg_type, length, xid = ofproto_parser.header(head)
                body = self._recv_exactly(length - of.OFP_HEADER_SIZE)
                self.got.append(msg_type)
                if msg_type == of.OFPT_FEATURES_REQUEST:
                    self._send(of.OFPT_FEATURES_REPLY, xid,
                               struct.pack(of.OFP_SWITCH_FEATURES_PACK_STR, self.dpid, 256, 254, 0, 0x4f, 0))
                elif msg_type == of.OFPT_MULTIPART_REQUEST:   # the port description: no ports
                    mp_type = struct.unpack_from("!H", body)[0]
                    self._send(of.OFPT_MULTIPART_REPLY, xid, struct.pack(of.OFP_MULTIPART_REPLY_PACK_STR, mp_type, 0))
                elif msg_type == of.OFPT_ECHO_REQUEST:
                    self._send(of.OFPT_ECHO_REPLY, xid, body)
        except (EOFError, OSError):
            pass
        finally:
            self.closed.set()

    def accepted(self) -> bool:
        """The controller took it for a switch: it sent it flows and a barrier."""
        return of.OFPT_BARRIER_REQUEST in self.got


def connect_rogue(pool: SdnPool, dpid: int, cert: str | None) -> RogueSwitch:
    """A rogue switch connecting from inside the core netns, over TLS with `cert` (a name in the pool's TLS
    directory, signed by the pool's CA) or over plain TCP (None)."""
    fd = os.open(f"/run/netns/{pool.core}", os.O_RDONLY)
    try:
        with nsutil.entered(fd):
            sock = socket.create_connection(("127.0.0.1", pool.of_port), timeout=10)
    finally:
        os.close(fd)
    if cert is not None:
        ctx = ssl.create_default_context(cafile=str(pool.tls / "ca.pem"))
        ctx.check_hostname = False   # like OVS: the CA authenticates the controller
        ctx.load_cert_chain(str(pool.tls / f"{cert}.pem"), str(pool.tls / f"{cert}.key"))
        sock = ctx.wrap_socket(sock)
    rogue = RogueSwitch(sock, dpid)
    rogue.start()
    return rogue


def settle(rogue: RogueSwitch, bound: float = 15.0) -> None:
    """Wait until the controller either hung up on the rogue or sent it a barrier (the bound only ends a hang)."""
    deadline = time.time() + bound
    while not rogue.closed.is_set() and not rogue.accepted() and time.time() < deadline:
        time.sleep(0.1)


@pytest.mark.parametrize("cert,dpid,reason", [
    (None, CORE_DPID, ""),                                            # plain TCP: refused in the TLS handshake
    ("ep1", CORE_DPID, "has role 'lark-ep', not 'lark-switch'"),      # an EP's certificate from the same CA
    (certs.switch_name(OTHER_DPID), CORE_DPID, f"bound to datapath {OTHER_DPID:016x}"),   # another switch's
    (certs.switch_name(CORE_DPID), CORE_DPID, "is already connected"),   # the real switch's own (stolen) key
], ids=["plain-tcp", "ep-certificate", "other-switch-certificate", "second-connection-same-dpid"])
def test_a_rogue_switch_is_refused_and_the_real_switch_keeps_working(pool, cert, dpid, reason):
    certs.make(str(pool.tls), [f"switch:{OTHER_DPID:x}"])
    pool.add_job("alice", "ep1", "alice", 10)
    pool.add_job("mallory", "ep1", "mallory", 13)
    assert pool.register("alice")[0] == 200
    rogue = connect_rogue(pool, dpid, cert)
    settle(rogue)
    assert rogue.closed.is_set() and not rogue.accepted(), f"the rogue was taken for a switch: got {rogue.got}"
    if cert is None:
        assert of.OFPT_FEATURES_REQUEST not in rogue.got, "a plain-TCP peer got as far as OpenFlow"
    else:
        assert f"refused OpenFlow connection from 127.0.0.1 claiming datapath {dpid:016x}: " in pool.log()
        assert reason in pool.log()
    # The real switch is still the one the controller programs: a blocked owner's job gets its drop flows there.
    code, body = pool.register("mallory")
    assert code == 200 and body["switches"] == 1, body
    st = pool.api("GET", "/v1/status", cert="controller")[1]
    assert [s["dpid"] for s in st["switches"]] == [f"{CORE_DPID:016x}"]
    assert len(pool.flows_with_cookie(body["cookie"])) == 2
    assert not pool.connects("mallory", GW, 7000)
    assert pool.connects("alice", GW, 7000)


def test_a_switch_with_its_own_certificate_is_accepted(pool):
    """The control for the rogue: with a switch certificate bound to the datapath id it claims, it is a switch."""
    certs.make(str(pool.tls), [f"switch:{OTHER_DPID:x}"])
    rogue = connect_rogue(pool, OTHER_DPID, certs.switch_name(OTHER_DPID))
    settle(rogue)
    assert rogue.accepted() and of.OFPT_FLOW_MOD in rogue.got
    st = pool.api("GET", "/v1/status", cert="controller")[1]
    assert sorted(s["dpid"] for s in st["switches"]) == sorted([f"{CORE_DPID:016x}", f"{OTHER_DPID:016x}"])


def test_plain_openflow_takes_the_knob_and_warns(tmp_path):
    p = SdnPool(str(tmp_path), openflow_tls=False)
    try:
        p.start()
        assert "insecure_plain_openflow = true: OpenFlow on 127.0.0.1" in p.log()
    finally:
        p.close()
