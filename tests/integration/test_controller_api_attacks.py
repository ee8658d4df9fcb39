"""Issue 26: the registration API as an attacker on the site network (or a compromised EP) meets it, against the real
controller process and a real OVS switch: handshakes that never finish, malformed requests, another EP's job forged,
the flow table filled, every job read through the status. One pool for the file (CI runs on 2 cores)."""
import contextlib
import http.client
import json
import os
import re
import shutil
import socket

import pytest
from helpers.sdn import CORE_DPID, GW, SdnPool
from helpers.waits import wait_until

from lark.controller import certs
from lark.kernel import netns as nsutil

pytestmark = pytest.mark.skipif(not shutil.which("ovs-vswitchd"), reason="Open vSwitch is not installed")

WORKERS, HANDSHAKE_S, MAX_HANDSHAKES, EP1_QUOTA = 4, 2.0, 64, 6
SLICES = """
[[policy]]
name = "slices"
kind = "slice"
select = 'true'
"""


class ScopedPool(SdnPool):
    """The pool with the API's bounds set low and an [ep.NAME] section per EP: ep1's jobs are numbers 1-9 (switch
    ports j1, j2), ep2's 10-19 (j11, j12); add_job names its ports j<n>-<id> and gives job n 10.77.1.<n>."""

    def write_config(self) -> None:
        super().write_config()
        text = self.cfg_path.read_text().replace(
            "[api]\n", f"[api]\nworkers = {WORKERS}\nhandshake_timeout = {HANDSHAKE_S}\n"
                       f"max_handshakes = {MAX_HANDSHAKES}\n", 1)
        self.cfg_path.write_text(text + f"""
[ep.ep1]
ports = ["j1-{self.id}", "j2-{self.id}"]
addresses = ["10.77.1.1-10.77.1.9"]
max_jobs = {EP1_QUOTA}
[ep.ep2]
ports = ["j11-{self.id}", "j12-{self.id}"]
addresses = ["10.77.1.10-10.77.1.19"]
""")


@pytest.fixture(scope="module")
def pool(tmp_path_factory):
    p = ScopedPool(str(tmp_path_factory.mktemp("api-attacks")), policies=SLICES)
    try:
        p.start()
        p.add_job("alice1", "ep1", "alice", 1)
        p.add_job("alice2", "ep2", "alice", 11)
        p.add_job("bob", "ep2", "bob", 12)
        yield p
    finally:
        p.close()


@contextlib.contextmanager
def in_core(pool):
    fd = os.open(f"/run/netns/{pool.core}", os.O_RDONLY)
    try:
        with nsutil.entered(fd):
            yield
    finally:
        os.close(fd)


def threads(pool) -> int:
    with open(f"/proc/{pool.ctl.pid}/status") as f:
        return int(next(line.split()[1] for line in f if line.startswith("Threads:")))


def closed_by_peer(s: socket.socket) -> bool:
    try:
        return s.recv(1) == b""
    except BlockingIOError:
        return False
    except OSError:          # reset
        return True


def raw_request(pool, head: str, body: bytes = b"", cert: str = "ep1") -> tuple[int, dict]:
    """An HTTP request exactly as written (headers a client library would never send), over mutual TLS; the body's
    own Content-Length unless the head has one."""
    if "Content-Length" not in head:
        head += f"Content-Length: {len(body)}\n"
    with in_core(pool):
        sock = socket.create_connection(("127.0.0.1", pool.api_port), timeout=30)
    with pool.ssl_context(cert).wrap_socket(sock, server_hostname="127.0.0.1") as s:
        s.sendall(head.replace("\n", "\r\n").encode("latin-1") + b"\r\n" + body)   # as HTTP headers are
        data = b""
        while b"\r\n\r\n" not in data:
            data += s.recv(65536)
        header, _, rest = data.partition(b"\r\n\r\n")
        length = int(re.search(rb"Content-Length: (\d+)", header).group(1))
        while len(rest) < length:
            rest += s.recv(65536)
        return int(header.split()[1]), json.loads(rest)


def flow_specs(pool, cookie: str) -> set[str]:
    """A job's flows on the switch without their counters."""
    return {re.sub(r"(duration|n_packets|n_bytes|idle_age|hard_age)=[^ ,]+,? ?", "", f)
            for f in pool.flows_with_cookie(cookie)}


def test_idle_and_stalled_handshakes_hold_no_threads_and_an_ep_still_registers(pool):
    before = threads(pool)
    attackers = []
    with in_core(pool):
        for _ in range(150):     # connect and say nothing
            attackers.append(socket.create_connection(("127.0.0.1", pool.api_port)))
        for _ in range(40):      # the start of a TLS ClientHello, then nothing
            s = socket.create_connection(("127.0.0.1", pool.api_port))
            s.sendall(bytes.fromhex("160301020001") + b"\x00\x01\xfc\x03\x03")
            attackers.append(s)
    try:
        code, body = pool.register("alice1")
        assert code == 200, body
        assert threads(pool) <= before + WORKERS, "the controller spends threads on unauthenticated connections"
        for s in attackers:
            s.setblocking(False)
        wait_until(lambda: all(closed_by_peer(s) for s in attackers),
                   f"the controller to close every connection without a handshake after {HANDSHAKE_S} s",
                   detail=pool.log)
    finally:
        for s in attackers:
            s.close()
    assert pool.api("GET", "/v1/status", cert="controller")[0] == 200


def test_kept_alive_connections_wait_for_their_next_request_without_a_worker(pool):
    """larkd keeps its connection open between requests: more such EPs than workers must not hold them all, and
    one EP may not open more than its share."""
    conns = []
    try:
        with in_core(pool):
            for ep in ["ep1", "ep2"] * 4:          # 8 kept-alive connections, 4 workers
                conns.append(http.client.HTTPSConnection("127.0.0.1", pool.api_port, timeout=30,
                                                         context=pool.ssl_context(ep)))
                conns[-1].connect()
            extra = http.client.HTTPSConnection("127.0.0.1", pool.api_port, timeout=30,
                                                context=pool.ssl_context("ep1"))
            extra.connect()
        for _turn in range(2):                   # each serves a request, waits idle, serves the next
            for c in conns:
                c.request("GET", "/v1/status")
                r = c.getresponse()
                assert r.status == 200 and not r.will_close, r.read()
                r.read()
            load = pool.api("GET", "/v1/status", cert="controller")[1]["api"]
            assert load["idle"] >= len(conns) and load["serving"] == 1, load
        with pytest.raises((OSError, http.client.HTTPException)):   # ep1's fifth connection was closed
            extra.request("GET", "/v1/status")
            extra.getresponse().read()
    finally:
        for c in [*conns, extra]:
            c.close()


@pytest.mark.parametrize("head, body, words", [
    ("POST /v1/jobs HTTP/1.1\nHost: c\nContent-Length: -1\n", b"{}", "Content-Length"),
    ("POST /v1/jobs HTTP/1.1\nHost: c\nContent-Length: 2x\n", b"{}", "Content-Length"),
    ("POST /v1/jobs HTTP/1.1\nHost: c\nContent-Length: \u00b2\n", b"{}", "Content-Length"),   # a digit to isdigit()
    ("POST /v1/jobs HTTP/1.1\nHost: c\nContent-Length: 2\nContent-Length: 9\n", b"{}", "Content-Length"),
    ("POST /v1/jobs HTTP/1.1\nHost: c\nContent-Length: 99999999\n", b"", "too large"),
    ("PUT /v1/sync HTTP/1.1\nHost: c\n", b'{"jo', "not JSON"),
    ("PUT /v1/sync HTTP/1.1\nHost: c\n", b"[" * 200000, "not JSON"),
    ("PUT /v1/sync HTTP/1.1\nHost: c\n", b'{"jobs": "no"}', "resync must carry"),
    ("POST /v1/jobs HTTP/1.1\nHost: c\nContent-Length: 20\n", b'{"key": 5', "did not arrive"),
    ("POST /v1/jobs HTTP/1.1\nHost: c\n",
     b'{"key": "s", "job_id": "1.0", "mac": "02:77:00:01:00:02", "addresses": [167838465]}', "addresses"),
    ("POST /v1/jobs HTTP/1.1\nHost: c\n",
     b'{"key": "s", "job_id": "1.0", "mac": "02:77:00:01:00:02", "addresses": ["10.77.1.1"], '
     b'"request_bandwidth_mbit": NaN}', "request_bandwidth_mbit"),
])
def test_malformed_requests_are_refused_with_400_and_the_reason(pool, head, body, words):
    code, answer = raw_request(pool, head, body)
    assert code == 400 and words in answer["error"], answer
    assert pool.ctl.poll() is None


def test_an_ep_cannot_register_another_ep_s_job_or_addresses(pool):
    code, body = pool.register("bob")
    assert code == 200, body
    bob = pool.jobs["bob"]["reg"]
    before = flow_specs(pool, body["cookie"])
    forged = [{**bob, "key": "slot-x"},                                      # bob's job as ep1's
              {**bob, "key": "slot-x", "mac": "02:77:00:05:00:02"},          # bob's address, another MAC
              {**bob, "key": "slot-x", "addresses": ["10.77.1.5"]},          # bob's MAC, an address of ep1's
              {**bob, "key": "slot-x", "mac": "02:77:00:63:00:02", "addresses": ["10.77.1.99"]}]   # nobody's
    for reg in forged:
        code, answer = pool.api("POST", "/v1/jobs", reg, cert="ep1")
        assert code == 403 and "registration from ep1" in answer["error"], answer
    code, answer = pool.api("PUT", "/v1/sync", {"jobs": forged[:1]}, cert="ep1")
    assert code == 403, answer
    code, answer = pool.api("POST", "/v1/jobs", {**bob, "key": "slot-x", "addresses": ["10.77.1.6"]},
                            cert="intruder")
    assert code == 403 and "[ep.intruder]" in answer["error"], answer
    assert flow_specs(pool, body["cookie"]) == before
    # ep1's own job: its source flows name its EP's port, and it still reaches its owner's job on ep2 and the router
    code, mine = pool.register("alice1")
    assert code == 200, mine
    assert pool.register("alice2")[0] == 200
    port = pool.ovs.vsctl("get", "Interface", f"j1-{pool.id}", "ofport").strip()
    source = [f for f in pool.flows_with_cookie(mine["cookie"]) if "table=0" in f and "priority=270" not in f]
    assert source and all(f"in_port={port}" in f for f in source), source
    assert pool.connects("alice1", pool.ip("alice2")) and pool.connects("alice1", GW, 7000)
    assert not pool.connects("alice1", pool.ip("bob"))


def test_the_flow_table_is_not_exhausted_beyond_an_ep_s_quota(pool):
    assert pool.sync("ep1", [])[0] == 200

    def fake(n):
        return {"key": f"slot-q{n}", "job_id": f"{n}.0", "owner": "alice", "addresses": [f"10.77.1.{n}"],
                "mac": f"02:77:00:{n:02x}:00:02"}
    try:
        for n in range(2, 2 + EP1_QUOTA):
            code, body = pool.api("POST", "/v1/jobs", fake(n), cert="ep1")
            assert code == 200, body
        code, body = pool.api("POST", "/v1/jobs", fake(9), cert="ep1")
        assert code == 429 and "quota" in body["error"], body
        code, body = pool.api("PUT", "/v1/sync", {"jobs": [fake(n) for n in range(2, 3 + EP1_QUOTA)]}, cert="ep1")
        assert code == 429, body
        st = pool.api("GET", "/v1/status", cert="controller")[1]
        assert sum(j["ep"] == "ep1" for j in st["jobs"]) == EP1_QUOTA
        assert not any("10.77.1.9" in f for f in pool.flows())
    finally:
        assert pool.sync("ep1", [])[0] == 200


def test_the_status_tells_an_ep_only_about_its_own_jobs(pool):
    for name in ("alice1", "bob"):
        assert pool.register(name)[0] == 200
    code, st = pool.api("GET", "/v1/status", cert="ep1")
    assert code == 200 and st["jobs"] and {j["ep"] for j in st["jobs"]} == {"ep1"}, st
    assert "bob" not in json.dumps(st) and "switches" not in st
    everything = pool.api("GET", "/v1/status", cert="controller")[1]
    assert {"ep1", "ep2"} <= {j["ep"] for j in everything["jobs"]} and everything["switches"]


def test_a_switch_or_the_controller_certificate_cannot_register_remove_or_resync_jobs(pool):
    """The CA signs EP, switch and controller certificates alike; only an EP's (OU lark-ep) may change jobs. A stolen
    switch key must not register a job (its flows would tag any MAC into any slice), and the controller's own
    certificate, which may read everything, must not act for an EP (an empty resync "for ep2" would wipe its jobs)."""
    assert pool.register("bob")[0] == 200
    bob = pool.jobs["bob"]["reg"]
    before = {j["key"]: j["cookie"] for j in pool.api("GET", "/v1/status", cert="ep2")[1]["jobs"]}
    flows_before = flow_specs(pool, before[bob["key"]])
    switch = certs.switch_name(CORE_DPID)
    forged = {**bob, "key": "slot-forged", "mac": "02:77:00:0d:00:02", "addresses": ["10.77.1.13"]}
    for cert, role in (("controller", "lark-controller"), (switch, "lark-switch")):
        attempts = [("POST", "/v1/jobs", forged), ("POST", "/v1/jobs", {**forged, "ep": "ep2"}),
                    ("PUT", "/v1/sync", {"ep": "ep2", "jobs": []}), ("PUT", "/v1/sync", {"jobs": [forged]}),
                    ("DELETE", f"/v1/jobs/{bob['key']}", None)]
        for method, path, body in attempts:
            code, answer = pool.api(method, path, body, cert=cert)
            assert code == 403 and f"role {role!r}" in answer["error"] and "EP certificates" in answer["error"], \
                (cert, method, path, answer)
    code, answer = pool.api("GET", "/v1/status", cert=switch)
    assert code == 403 and "'lark-switch'" in answer["error"], answer
    # nothing changed: ep2's jobs and bob's flows are all there, no forged job anywhere
    everything = pool.api("GET", "/v1/status", cert="controller")
    assert everything[0] == 200 and everything[1]["switches"], everything
    assert {j["key"]: j["cookie"] for j in everything[1]["jobs"] if j["ep"] == "ep2"} == before
    assert not any(j["key"] == "slot-forged" for j in everything[1]["jobs"])
    assert flow_specs(pool, before[bob["key"]]) == flows_before
    assert not any("10.77.1.13" in f for f in pool.flows())
    # and an EP's certificate still registers: the check is by role, not a blanket refusal
    assert pool.register("bob")[0] == 200
