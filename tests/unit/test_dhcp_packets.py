"""DHCP packets: what the client sends, and that no reply bytes can crash larkd."""
import socket
import struct

from hypothesis import given, strategies as st

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
