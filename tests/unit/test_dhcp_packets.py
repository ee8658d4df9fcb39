"""DHCP packets: what the client sends, and that no reply bytes can crash larkd."""
import socket
import struct

import pytest
from hypothesis import given, strategies as st

from lark.errors import LarkError
from lark.kernel import dhcp


def reply(msg_type, xid=7, yiaddr="198.51.100.160", opts=None):
    head = dhcp.BOOTP.pack(2, 1, 6, 0, xid, 0, 0, bytes(4), socket.inet_aton(yiaddr), bytes(4), bytes(4),
                           bytes(16), bytes(64), bytes(128))
    items = [(dhcp.OPT_TYPE, bytes([msg_type]))] + (opts or [])
    return head + dhcp.MAGIC + dhcp._options(items)


def test_discover_has_broadcast_flag_client_id_and_params():
    pkt = dhcp.build(dhcp.DISCOVER, 0x1234, "02:aa:bb:cc:dd:ee")
    f = dhcp.BOOTP.unpack_from(pkt)
    assert f[0] == 1 and f[4] == 0x1234 and f[6] == 0x8000
    assert f[11][:6] == bytes.fromhex("02aabbccddee")
    assert pkt[dhcp.BOOTP.size:dhcp.BOOTP.size + 4] == dhcp.MAGIC
    assert bytes([dhcp.OPT_CLIENT_ID, 7, 1]) + bytes.fromhex("02aabbccddee") in pkt


def test_ack_becomes_a_lease_with_server_times():
    opts = [(dhcp.OPT_MASK, socket.inet_aton("255.255.254.0")), (dhcp.OPT_ROUTER, socket.inet_aton("198.51.100.1")),
            (dhcp.OPT_SERVER, socket.inet_aton("198.51.100.1")), (dhcp.OPT_LEASE, struct.pack("!I", 600))]
    xid, yiaddr, o = dhcp.parse(reply(dhcp.ACK, opts=opts))
    lease = dhcp.lease_from(yiaddr, o, 1000.0)
    assert (xid, lease.address, lease.prefix, lease.router, lease.server) == (7, "198.51.100.160", 23,
                                                                              "198.51.100.1", "198.51.100.1")
    assert (lease.lease_time, lease.t1, lease.t2) == (600, 300, 525)
    assert lease.usable(1299.0) and not lease.usable(1300.0) and lease.renew_due(1300.0)
    assert dhcp.Lease.from_dict(lease.to_dict()) == lease


def test_requests_are_not_replies():
    assert dhcp.parse(dhcp.build(dhcp.REQUEST, 1, "02:00:00:00:00:01")) is None


@given(st.binary(max_size=600))
def test_parse_never_raises_on_garbage(data):
    got = dhcp.parse(data)
    assert got is None or isinstance(got[2], dict)


@given(st.binary(max_size=300))
def test_parse_never_raises_on_garbage_options(tail):
    head = reply(dhcp.OFFER)[:dhcp.BOOTP.size + 4]
    got = dhcp.parse(head + tail)
    assert got is None or isinstance(got[2], dict)


# -- validation of answers (issue 14, item 8) ---------------------------------------------------------------
MAC = "02:aa:bb:cc:dd:ee"
SERVER, ROGUE = "198.51.100.1", "198.51.100.66"


def answer(msg_type, xid, yiaddr="198.51.100.160", server=SERVER, lease=600, mac=MAC, extra=()):
    head = dhcp.BOOTP.pack(2, 1, 6, 0, xid, 0, 0, bytes(4), socket.inet_aton(yiaddr), bytes(4), bytes(4),
                           bytes.fromhex(mac.replace(":", "")).ljust(16, b"\0"), bytes(64), bytes(128))
    opts = [(dhcp.OPT_TYPE, bytes([msg_type])), (dhcp.OPT_MASK, socket.inet_aton("255.255.255.0")),
            (dhcp.OPT_LEASE, struct.pack("!I", lease)), *extra]
    if server:
        opts.append((dhcp.OPT_SERVER, socket.inet_aton(server)))
    return head + dhcp.MAGIC + dhcp._options(opts)


class FakeServerSocket:
    """Stands in for the client's UDP socket: each packet the client sends gets the scripted answers."""

    def __init__(self, script):
        self.script, self.sent, self.pending = script, [], []

    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False

    def sendto(self, packet, dest):
        f = dhcp.BOOTP.unpack_from(packet)
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
    request = dhcp.parse(b"\x02" + fake.sent[-1][0][1:])  # read as a reply: our REQUEST names the offering server
    assert socket.inet_ntoa(request[2][dhcp.OPT_SERVER]) == SERVER


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
    assert bytes([dhcp.OPT_CLIENT_ID, 17]) + dhcp.client_id(MAC, "alice") in fake.sent[0][0]


@pytest.mark.parametrize("lease,why", [(0, "below the minimum"), (59, "below the minimum")])
def test_lease_times_below_the_minimum_are_refused(lease, why):
    _, y, o = dhcp.parse(answer(dhcp.ACK, 1, lease=lease))
    with pytest.raises(dhcp.BadAnswer, match=why):
        dhcp.lease_from(y, o, 0.0)


def test_long_leases_are_cut_and_bad_timers_replaced():
    _, y, o = dhcp.parse(answer(dhcp.ACK, 1, lease=0xFFFFFFFF))
    assert dhcp.lease_from(y, o, 0.0).lease_time == dhcp.MAX_LEASE_S
    _, y, o = dhcp.parse(answer(dhcp.ACK, 1, lease=600, extra=[(dhcp.OPT_T1, struct.pack("!I", 700)),
                                                                 (dhcp.OPT_T2, struct.pack("!I", 10))]))
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
