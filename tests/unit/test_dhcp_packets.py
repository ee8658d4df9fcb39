"""DHCP packets: what the client sends, and that no reply bytes can crash larkd.

Replies are built here with struct, independently of the codec under test (pyroute2's)."""
import socket
import struct

from hypothesis import given, strategies as st

from lark.kernel import dhcp

BOOTP = struct.Struct("!BBBBIHH4s4s4s4s16s64s128s")
OPT_MASK, OPT_ROUTER, OPT_LEASE, OPT_TYPE, OPT_SERVER, OPT_CLIENT_ID = 1, 3, 51, 53, 54, 61


def _options(items):
    return b"".join(bytes([code, len(value)]) + value for code, value in items) + b"\xff"


def reply(msg_type, xid=7, yiaddr="198.51.100.160", opts=None):
    head = BOOTP.pack(2, 1, 6, 0, xid, 0, 0, bytes(4), socket.inet_aton(yiaddr), bytes(4), bytes(4),
                      bytes(16), bytes(64), bytes(128))
    return head + dhcp.MAGIC + _options([(OPT_TYPE, bytes([msg_type]))] + (opts or []))


def test_discover_has_broadcast_flag_client_id_and_params():
    pkt = dhcp.build(dhcp.DISCOVER, 0x1234, "02:aa:bb:cc:dd:ee")
    f = BOOTP.unpack_from(pkt)
    assert f[0] == 1 and f[4] == 0x1234 and f[6] == 0x8000
    assert f[11][:6] == bytes.fromhex("02aabbccddee")
    assert pkt[BOOTP.size:BOOTP.size + 4] == dhcp.MAGIC
    assert bytes([OPT_TYPE, 1, dhcp.DISCOVER]) in pkt
    assert bytes([OPT_CLIENT_ID, 7, 1]) + bytes.fromhex("02aabbccddee") in pkt
    assert bytes([55, len(dhcp.PARAMS), *dhcp.PARAMS]) in pkt and pkt.endswith(b"\xff")


def test_renewal_and_release_are_unicast_from_the_leased_address():
    pkt = dhcp.build(dhcp.RELEASE, 9, "02:00:00:00:00:01", ciaddr="198.51.100.160", server="198.51.100.1",
                     broadcast=False)
    f = BOOTP.unpack_from(pkt)
    assert f[6] == 0 and socket.inet_ntoa(f[7]) == "198.51.100.160"
    assert bytes([OPT_SERVER, 4]) + socket.inet_aton("198.51.100.1") in pkt
    assert bytes([55]) not in pkt[BOOTP.size + 4:BOOTP.size + 7]  # no parameter list in a RELEASE


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


@given(st.binary(max_size=600))
def test_parse_never_raises_on_garbage(data):
    got = dhcp.parse(data)
    assert got is None or isinstance(got[2], dict)


@given(st.binary(max_size=300))
def test_parse_never_raises_on_garbage_options(tail):
    head = reply(dhcp.OFFER)[:BOOTP.size + 4]
    got = dhcp.parse(head + tail)
    assert got is None or ("message_type" in got[2] and isinstance(got[1], str))
