"""What the capacity work (issue 26) changed in the controller's request path, against fakes of the switch
connection and the HTTP socket: a change with no flow mods for a switch costs no barrier, one with flow mods is
answered only after the switch acknowledged its barrier; the API's own header parsing; canonical IPv4 addresses."""
import gc
import io
import ipaddress
import threading
import time
import weakref
from types import SimpleNamespace

import pytest
from os_ken.ofproto import ofproto_v1_3 as ofp
from os_ken.ofproto import ofproto_v1_3_parser as parser

from lark.controller import config as ccfg
from lark.controller.api import Handler
from lark.controller.model import CANONICAL_IPV4_RE, JobReg
from lark.controller.ofapp import LarkSwitchApp
from lark.controller.pipeline import Flow
from lark.controller.switch import Switch, SwitchError
from lark.errors import LarkError


class FakeDatapath:
    """A switch connection: records what goes out (flow mods as bytes, barriers as messages)."""

    def __init__(self, ports=None):
        self.id, self.ofproto, self.ofproto_parser = 1, ofp, parser
        self.ports = {no: SimpleNamespace(name=name.encode()) for name, no in (ports or {}).items()}
        self.written: list[bytes] = []
        self.requests: list = []
        self._xid = 0

    def set_xid(self, msg) -> None:
        self._xid += 1
        msg.set_xid(self._xid)

    def send(self, buf: bytes) -> None:
        self.written.append(buf)

    def send_msg(self, msg) -> None:
        self.requests.append(msg)


def app_and_switch(ports=None, barrier_timeout=2.0):
    app = LarkSwitchApp.__new__(LarkSwitchApp)   # os-ken's app manager is not needed to send a batch
    app.cfg = ccfg.from_mapping({"switch": {"barrier_timeout": barrier_timeout}})
    app._waiters, app._errors, app._xid_lock = {}, {}, threading.Lock()
    dp = FakeDatapath(ports)
    return app, Switch(dp), dp


FLOW = Flow(0, 300, (("eth_src", "02:00:00:00:00:01"),), ("goto", 1, 5, 0xFF))


def test_a_change_without_flow_mods_for_the_switch_sends_no_barrier_and_does_not_wait():
    app, sw, dp = app_and_switch(barrier_timeout=0.05)
    assert app._batch(sw, [], []) == 0
    # a flow that names a port this switch lacks is not for this switch: nothing to acknowledge either
    on_port = Flow(0, 300, (("eth_src", "02:00:00:00:00:01"), ("in_port", "sp0001")), ("drop",))
    assert app._batch(sw, [(0x4A00000000000001, on_port, "job 1.0")], []) == 0
    assert dp.written == [] and dp.requests == []


def test_a_change_with_flow_mods_is_acknowledged_only_after_the_switch_answers_its_barrier():
    app, sw, dp = app_and_switch()
    out: list = []
    t = threading.Thread(target=lambda: out.append(app._batch(sw, [(0x4A00000000000001, FLOW, "job 1.0")], [7])))
    t.start()
    deadline = time.monotonic() + 5
    while not dp.requests and time.monotonic() < deadline:
        time.sleep(0.01)
    assert [type(m) for m in dp.requests] == [parser.OFPBarrierRequest]
    assert len(dp.written) == 1 and len(dp.written[0]) > 0      # the delete and the add, in one write
    time.sleep(0.2)
    assert t.is_alive() and out == [], "answered before the switch acknowledged the flows"
    app._waiters[(dp.id, dp.requests[0].xid)].done.set()          # the barrier reply
    t.join(5)
    assert out == [1]


def test_a_barrier_the_switch_never_answers_fails_the_change():
    app, sw, _dp = app_and_switch(barrier_timeout=0.1)
    with pytest.raises(SwitchError, match="did not answer"):
        app._batch(sw, [(0x4A00000000000001, FLOW, "job 1.0")], [])


def handler(request: bytes):
    """A Handler that has read `request`'s first line, as http.server's handle_one_request leaves it."""
    h = Handler.__new__(Handler)
    h.rfile, h.wfile = io.BytesIO(request), io.BytesIO()
    h.raw_requestline = h.rfile.readline(65537)
    h.client_address = ("127.0.0.1", 1)
    h.request_version = "HTTP/1.1"
    return h


def test_headers_are_read_by_name_with_every_value_and_keep_alive_follows_the_version():
    h = handler(b"POST /v1/jobs HTTP/1.1\r\nHost: c\r\ncontent-length:  12 \r\nX-A: 1\r\nX-A: 2\r\n\r\n{}")
    assert h.parse_request()
    assert (h.command, h.path, h.close_connection) == ("POST", "/v1/jobs", False)
    assert h.headers.get("Content-Length") == "12" and h.headers.get_all("x-a") == ["1", "2"]
    assert h.headers.get_all("Content-Type") is None and h.rfile.read() == b"{}"
    h = handler(b"GET /v1/status HTTP/1.0\r\n\r\n")
    assert h.parse_request() and h.close_connection
    h = handler(b"GET /v1/status HTTP/1.1\r\nConnection: close\r\n\r\n")
    assert h.parse_request() and h.close_connection


@pytest.mark.parametrize("request_bytes, code", [
    (b"POST /v1/jobs HTTP/1.1\r\nHost: c\r\n folded: on\r\n\r\n", 400),     # a folded line
    (b"POST /v1/jobs HTTP/1.1\r\nNo colon here\r\n\r\n", 400),
    (b"POST /v1/jobs HTTP/1.1\r\nContent-Length : 2\r\n\r\n", 400),          # space before the colon
    (b"POST /v1/jobs HTTP/1.1\r\n" + b"X: y\r\n" * 101 + b"\r\n", 431),
    (b"POST /v1/jobs HTTP/1.1\r\nX: " + b"y" * 70000 + b"\r\n\r\n", 431),
    (b"POST /v1/jobs HTTP/2.0\r\n\r\n", 505),
    (b"POST /v1/jobs\r\n\r\n", 400),
    (b"POST /v1/jobs x HTTP/1.1\r\n\r\n", 400),
])
def test_bad_request_lines_and_headers_are_refused_with_their_status(request_bytes, code):
    h = handler(request_bytes)
    assert not h.parse_request()
    assert h.wfile.getvalue().split(b" ", 2)[1] == str(code).encode() and h.close_connection


def test_canonical_ipv4_is_taken_as_it_is_and_anything_else_goes_through_ipaddress():
    def canonical(a: str) -> bool:
        try:
            return isinstance(ipaddress.ip_address(a), ipaddress.IPv4Address) and str(ipaddress.ip_address(a)) == a
        except ValueError:
            return False
    for o in range(300):
        for t in (str(o), f"0{o}", f" {o}", f"{o}\n", f"+{o}"):
            for a in (f"{t}.1.2.3", f"10.{t}.1.2", f"1.2.3.{t}"):
                assert bool(CANONICAL_IPV4_RE.fullmatch(a)) == canonical(a), a
    for a in ("1.2.3", "1.2.3.4.5", "\u0661.2.3.4", "1.2.3.4/32", "::ffff:1.2.3.4"):
        assert not CANONICAL_IPV4_RE.fullmatch(a)
    job = JobReg.from_wire({"key": "k", "job_id": "1.0", "mac": "02:00:00:00:00:01",
                            "addresses": ["10.0.0.1", "FD00::0001"]}, "ep1")
    assert job.addresses == ["10.0.0.1", "fd00::1"]
    with pytest.raises(LarkError, match=r"10\.0\.0\.01"):
        JobReg.from_wire({"key": "k", "job_id": "1.0", "mac": "02:00:00:00:00:01", "addresses": ["10.0.0.01"]}, "ep1")


def test_settle_heap_freezes_survivors_and_the_thaw_collects_a_cycle_that_died_frozen():
    from lark.controller.ofapp import settle_heap

    class Node:
        pass
    try:
        a, b = Node(), Node()
        a.other, b.other = b, a     # a reference cycle: only the collector frees it
        settle_heap()
        assert gc.get_freeze_count() > 0
        ref = weakref.ref(a)
        del a, b
        settle_heap()
        assert ref() is not None, "a frozen cycle was collected without a thaw"
        settle_heap(thaw=True)
        assert ref() is None
    finally:
        gc.unfreeze()
