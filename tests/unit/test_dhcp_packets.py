"""DHCP packets: what the client sends, and that no reply bytes can crash larkd.

Packets are built and read here with struct, independently of the codec under test (pyroute2's)."""
import socket
import struct

import pytest
from hypothesis import given, strategies as st

from lark.errors import LarkError
from lark.kernel import dhcp

BOOTP = struct.Struct("!BBBBIHH4s4s4s4s16s64s128s")
OPT_MASK, OPT_ROUTER, OPT_REQ_IP, OPT_LEASE, OPT_TYPE, OPT_SERVER = 1, 3, 50, 51, 53, 54
OPT_PARAMS, OPT_T1, OPT_T2, OPT_CLIENT_ID = 55, 58, 59, 61


def _options(items):
    return b"".join(bytes([code, len(value)]) + value for code, value in items) + b"\xff"


def reply(msg_type, xid=7, yiaddr="198.51.100.160", opts=None):
    head = BOOTP.pack(2, 1, 6, 0, xid, 0, 0, bytes(4), socket.inet_aton(yiaddr), bytes(4), bytes(4),
                      bytes(16), bytes(64), bytes(128))
    return head + dhcp.MAGIC + _options([(OPT_TYPE, bytes([msg_type]))] + (opts or []))


def request(msg_type, xid, mac, ciaddr="0.0.0.0", broadcast=True, cid=None, opts=()):
    """What the client must send, byte for byte (option order as RFC 2131 examples and Lark always had it)."""
    hw = bytes.fromhex(mac.replace(":", ""))
    head = BOOTP.pack(1, 1, 6, 0, xid, 0, 0x8000 if broadcast else 0, socket.inet_aton(ciaddr), bytes(4),
                      bytes(4), bytes(4), hw.ljust(16, b"\0"), bytes(64), bytes(128))
    return head + dhcp.MAGIC + _options([(OPT_TYPE, bytes([msg_type])), (OPT_CLIENT_ID, cid or b"\x01" + hw),
                                         *opts])


PARAMS = (OPT_PARAMS, bytes([1, 3, 6, 51, 54, 58, 59]))


def test_discover_has_broadcast_flag_client_id_and_params():
    pkt = dhcp.build(dhcp.DISCOVER, 0x1234, "02:aa:bb:cc:dd:ee")
    f = BOOTP.unpack_from(pkt)
    assert f[0] == 1 and f[4] == 0x1234 and f[6] == 0x8000
    assert f[11][:6] == bytes.fromhex("02aabbccddee")
    assert pkt[BOOTP.size:BOOTP.size + 4] == dhcp.MAGIC
    assert bytes([OPT_CLIENT_ID, 7, 1]) + bytes.fromhex("02aabbccddee") in pkt
    assert pkt == request(dhcp.DISCOVER, 0x1234, "02:aa:bb:cc:dd:ee", opts=[PARAMS])


def test_requests_are_the_exact_bytes_lark_always_sent():
    mac, cid = "02:aa:bb:cc:dd:ee", dhcp.client_id("02:aa:bb:cc:dd:ee", "alice")
    assert cid[0] == 0 and len(cid) == 17
    assert dhcp.build(dhcp.REQUEST, 5, mac, requested="198.51.100.160", server="198.51.100.1", owner="alice") == \
        request(dhcp.REQUEST, 5, mac, cid=cid, opts=[(OPT_REQ_IP, socket.inet_aton("198.51.100.160")),
                                                      (OPT_SERVER, socket.inet_aton("198.51.100.1")), PARAMS])
    # Renewal and release are unicast from the leased address; a RELEASE asks for no parameters.
    assert dhcp.build(dhcp.REQUEST, 6, mac, ciaddr="198.51.100.160", broadcast=False) == \
        request(dhcp.REQUEST, 6, mac, ciaddr="198.51.100.160", broadcast=False, opts=[PARAMS])
    assert dhcp.build(dhcp.RELEASE, 7, mac, ciaddr="198.51.100.160", server="198.51.100.1", broadcast=False,
                      owner="alice") == \
        request(dhcp.RELEASE, 7, mac, ciaddr="198.51.100.160", broadcast=False, cid=cid,
                opts=[(OPT_SERVER, socket.inet_aton("198.51.100.1"))])


def test_ack_becomes_a_lease_with_server_times():
    opts = [(OPT_MASK, socket.inet_aton("255.255.254.0")), (OPT_ROUTER, socket.inet_aton("198.51.100.1")),
            (OPT_SERVER, socket.inet_aton("198.51.100.1")), (OPT_LEASE, struct.pack("!I", 600))]
    xid, yiaddr, o = dhcp.parse(reply(dhcp.ACK, opts=opts))
    assert int(o["message_type"]) == dhcp.ACK
    lease = dhcp.lease_from(yiaddr, o, 1000.0)
    assert (xid, lease.address, lease.prefix, lease.router, lease.server) == (7, "198.51.100.160", 23,
                                                                              "198.51.100.1", "198.51.100.1")
    assert (lease.lease_time, lease.t1, lease.t2) == (600, 300, 525)
    assert lease.usable(1299.0) and not lease.usable(1300.0) and lease.renew_due(1300.0)
    assert dhcp.Lease.from_dict(lease.to_dict()) == lease


def test_a_reply_without_router_mask_or_times_gets_defaults():
    xid, yiaddr, o = dhcp.parse(reply(dhcp.OFFER, xid=3))
    lease = dhcp.lease_from(yiaddr, o, 0.0)
    assert (lease.prefix, lease.router, lease.server, lease.lease_time, lease.t1) == (24, None, "", 3600, 1800)


def test_requests_are_not_replies():
    assert dhcp.parse(dhcp.build(dhcp.REQUEST, 1, "02:00:00:00:00:01")) is None
    assert dhcp.parse(reply(dhcp.ACK)[:BOOTP.size + 4] + b"\xff") is None  # no message type: not a reply


@pytest.mark.parametrize("bad", [(OPT_LEASE, b"\0\0\2\x58\0\0"),       # a lease time of 6 bytes
                                 (OPT_SERVER, b"\xc6\x33"),                # a server id of 2 bytes
                                 (OPT_TYPE, b"\x05\x05")])                 # a message type of 2 bytes
def test_a_reply_with_an_option_of_the_wrong_length_is_dropped_whole(bad):
    # The options after the bad one would be lost: no lease may be made from the rest (e.g. a default lease time).
    good = [(OPT_SERVER, socket.inet_aton("198.51.100.1")), (OPT_LEASE, struct.pack("!I", 600))]
    assert dhcp.parse(reply(dhcp.ACK, opts=good)) is not None
    assert dhcp.parse(reply(dhcp.ACK, opts=[bad, *good])) is None
    assert dhcp.parse(reply(dhcp.ACK, opts=good)[:-3]) is None  # cut off inside the last option


@given(st.binary(max_size=600))
def test_parse_never_raises_on_garbage(data):
    got = dhcp.parse(data)
    assert got is None or isinstance(got[2], dict)


@given(st.binary(max_size=300))
def test_parse_never_raises_on_garbage_options(tail):
    head = reply(dhcp.OFFER)[:BOOTP.size + 4]
    got = dhcp.parse(head + tail)
    assert got is None or ("message_type" in got[2] and isinstance(got[1], str))


# -- validation of answers (issue 14, item 8) ---------------------------------------------------------------
MAC = "02:aa:bb:cc:dd:ee"
SERVER, ROGUE = "198.51.100.1", "198.51.100.66"


def answer(msg_type, xid, yiaddr="198.51.100.160", server=SERVER, lease=600, mac=MAC, extra=()):
    head = BOOTP.pack(2, 1, 6, 0, xid, 0, 0, bytes(4), socket.inet_aton(yiaddr), bytes(4), bytes(4),
                      bytes.fromhex(mac.replace(":", "")).ljust(16, b"\0"), bytes(64), bytes(128))
    opts = [(OPT_TYPE, bytes([msg_type])), (OPT_MASK, socket.inet_aton("255.255.255.0")),
            (OPT_LEASE, struct.pack("!I", lease)), *extra]
    if server:
        opts.append((OPT_SERVER, socket.inet_aton(server)))
    return head + dhcp.MAGIC + _options(opts)


class FakeServerSocket:
    """Stands in for the client's UDP socket: each packet the client sends gets the scripted answers."""

    def __init__(self, script):
        self.script, self.sent, self.pending = script, [], []

    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False

    def sendto(self, packet, dest):
        f = BOOTP.unpack_from(packet)
        self.sent.append((packet, dest))
        self.pending = list(self.script.pop(0)(f[4])) if self.script else []

    def settimeout(self, t):
        pass

    def recv(self, n):
        if not self.pending:
            raise socket.timeout()
        return self.pending.pop(0)


def client(monkeypatch, script, owner=""):
    c = dhcp.Client("eth0", MAC, "9.0", waits=(0.01, 0.01), owner=owner)
    fake = FakeServerSocket(script)
    monkeypatch.setattr(c, "_socket", lambda bind_ip="0.0.0.0": fake)
    return c, fake


def test_answers_for_another_client_or_from_another_server_are_ignored(monkeypatch):
    c, fake = client(monkeypatch, [
        lambda xid: [answer(dhcp.OFFER, xid, mac="02:00:00:00:00:99"),      # another client's hardware address
                     answer(dhcp.OFFER, xid + 1),                           # another exchange
                     answer(dhcp.OFFER, xid, server=None),                  # no server identifier
                     answer(dhcp.OFFER, xid)],
        lambda xid: [answer(dhcp.NAK, xid, server=ROGUE),                   # a rogue NAK must not stop us
                     answer(dhcp.ACK, xid, server=ROGUE, yiaddr="198.51.100.170"),
                     answer(dhcp.ACK, xid)],
    ])
    lease = c.acquire()
    assert (lease.address, lease.server, lease.lease_time) == ("198.51.100.160", SERVER, 600)
    sent = dhcp.parse(b"\x02" + fake.sent[-1][0][1:])  # read as a reply: our REQUEST names the offering server
    assert sent[2]["server_id"] == SERVER


def test_ack_for_another_address_than_offered_is_refused(monkeypatch):
    c, _ = client(monkeypatch, [lambda xid: [answer(dhcp.OFFER, xid)],
                                *[lambda xid: [answer(dhcp.ACK, xid, yiaddr="198.51.100.171")]] * 4])
    with pytest.raises(LarkError, match="not valid"):
        c.acquire()


def test_renewal_counts_only_the_granting_servers_ack(monkeypatch):
    old = dhcp.Lease("198.51.100.160", 24, None, SERVER, 600, 300, 525, 0.0, owner="alice")
    c, fake = client(monkeypatch, [lambda xid: [answer(dhcp.ACK, xid, server=ROGUE, lease=10**6)],
                                   lambda xid: [answer(dhcp.ACK, xid, server=ROGUE)]])
    with pytest.raises(LarkError, match="no DHCP answer"):
        c.renew(old)
    c, fake = client(monkeypatch, [lambda xid: [answer(dhcp.ACK, xid, lease=900)]])
    new = c.renew(old)
    assert (new.address, new.server, new.lease_time, new.owner) == (old.address, SERVER, 900, "alice")
    # The renewal speaks with the owner's client identifier.
    assert bytes([OPT_CLIENT_ID, 17]) + dhcp.client_id(MAC, "alice") in fake.sent[0][0]


@pytest.mark.parametrize("lease,why", [(0, "below the minimum"), (59, "below the minimum")])
def test_lease_times_below_the_minimum_are_refused(lease, why):
    _, y, o = dhcp.parse(answer(dhcp.ACK, 1, lease=lease))
    with pytest.raises(dhcp.BadAnswer, match=why):
        dhcp.lease_from(y, o, 0.0)


def test_long_leases_are_cut_and_bad_timers_replaced():
    _, y, o = dhcp.parse(answer(dhcp.ACK, 1, lease=0xFFFFFFFF))
    assert dhcp.lease_from(y, o, 0.0).lease_time == dhcp.MAX_LEASE_S
    _, y, o = dhcp.parse(answer(dhcp.ACK, 1, lease=600, extra=[(OPT_T1, struct.pack("!I", 700)),
                                                                 (OPT_T2, struct.pack("!I", 10))]))
    lease = dhcp.lease_from(y, o, 0.0)
    assert (lease.t1, lease.t2) == (300, 525)


@pytest.mark.parametrize("yiaddr", ["0.0.0.0", "224.0.0.1", "127.0.0.5", "255.255.255.255", "169.254.1.1"])
def test_unusable_addresses_are_refused(yiaddr):
    _, y, o = dhcp.parse(answer(dhcp.ACK, 1, yiaddr=yiaddr))
    with pytest.raises(dhcp.BadAnswer):
        dhcp.lease_from(y, o, 0.0)


def test_cached_lease_goes_only_to_its_owner(tmp_path):
    cache = dhcp.LeaseCache(str(tmp_path))
    cache.put("slot1", dhcp.Lease("198.51.100.160", 24, None, SERVER, 600, 300, 525, 0.0, owner="alice"))
    assert cache.get("slot1", "bob") is None and cache.get("slot1") is None
    cache.put("slot1", dhcp.Lease("198.51.100.161", 24, None, SERVER, 600, 300, 525, 0.0, owner="bob"))
    assert cache.get("slot1", "alice").address == "198.51.100.160"  # bob's lease did not replace alice's
    assert cache.get("slot1", "bob").address == "198.51.100.161"
    cache.drop("slot1", "alice")
    assert cache.get("slot1", "alice") is None and cache.get("slot1", "bob") is not None


def test_client_identifier_differs_per_owner():
    ids = {dhcp.client_id(MAC), dhcp.client_id(MAC, "alice"), dhcp.client_id(MAC, "bob")}
    assert len(ids) == 3
