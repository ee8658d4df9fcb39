"""The fixed rtnetlink requests of a job's setup, on a plain netlink socket.

pyroute2 0.9 runs an asyncio event loop for every request: ~0.16 ms for `ip link set lo up`, which the kernel
does in ~0.004 ms on a raw socket (measured on this 2-vCPU VM), and ~0.5 ms to make and close an IPRoute in a
job's netns. A NAT job's setup sent about ten such requests (in the job's netns: lo up, the device's index, the
device up, its address, its default route; on the host: the MTU of the route out, the gateway address and the
host route), so they go through this module. Everything else still uses pyroute2 (netns.JobNetlink makes the
job netns's IPRoute only when something asks for it; `beside` gives a raw socket only in the netns of the caller's
IPRoute).

Each request waits for its acknowledgement; a kernel error raises pyroute2's NetlinkError with the same code, so
callers handle both paths alike.
"""
from __future__ import annotations

import errno
import ipaddress
import os
import socket
import struct
import threading

from pyroute2.netlink.exceptions import NetlinkError

NETLINK_ROUTE = 0
NLMSG_ERROR = 2
NLMSG_DONE = 3
RTM_NEWLINK, RTM_GETLINK = 16, 18
RTM_NEWADDR = 20
RTM_NEWROUTE = 24
NLM_F_REQUEST, NLM_F_ACK, NLM_F_DUMP, NLM_F_EXCL, NLM_F_CREATE = 0x1, 0x4, 0x300, 0x200, 0x400
IFF_UP = 0x1
IFLA_IFNAME, IFLA_MTU = 3, 4
RTM_GETROUTE = 26
RTA_METRICS, RTAX_MTU = 8, 2
IFA_ADDRESS, IFA_LOCAL, IFA_FLAGS = 1, 2, 8
RTA_DST, RTA_OIF, RTA_GATEWAY = 1, 4, 5
RT_TABLE_MAIN, RTPROT_STATIC, RT_SCOPE_UNIVERSE, RTN_UNICAST = 254, 4, 0, 1
NLMSG_HDR = struct.Struct("=IHHII")   # len, type, flags, seq, pid
IFINFOMSG = struct.Struct("=BxHiII")  # family, type, index, flags, change
IFADDRMSG = struct.Struct("=BBBBi")   # family, prefixlen, flags, scope, index
RTMSG = struct.Struct("=BBBBBBBBI")   # family, dst_len, src_len, tos, table, protocol, scope, type, flags


def _attr(kind: int, payload: bytes) -> bytes:
    length = 4 + len(payload)
    return struct.pack("=HH", length, kind) + payload + b"\0" * (-length % 4)


def _attrs(payload: bytes, offset: int) -> dict[int, bytes]:
    """The attributes after a message's fixed header, by type (the first of each type; nested ones unparsed)."""
    out: dict[int, bytes] = {}
    while offset + 4 <= len(payload):
        length, kind = struct.unpack_from("=HH", payload, offset)
        if length < 4:
            break
        out.setdefault(kind & 0x3FFF, payload[offset + 4:offset + length])  # without NLA_F_NESTED/BYTEORDER
        offset += (length + 3) & ~3
    return out


class Rtnl:
    """A raw rtnetlink socket in the netns of the thread that makes it (it stays there)."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_CLOEXEC, NETLINK_ROUTE)
        self.sock.bind((0, 0))
        self._seq = 0
        self._lock = threading.Lock()
        self.cookie = netns_cookie(self.sock.fileno())

    def close(self) -> None:
        self.sock.close()

    def request(self, kind: int, flags: int, body: bytes) -> bytes:
        """Send one request and wait for its answer: the payload of the reply message (b"" for a bare ACK)."""
        replies = self._exchange(kind, NLM_F_ACK | flags, body)
        return replies[-1][1] if replies else b""

    def dump(self, kind: int, body: bytes) -> list[tuple[int, bytes]]:
        """A dump request: every message of the answer, as (type, payload)."""
        return self._exchange(kind, NLM_F_DUMP, body)

    def _exchange(self, kind: int, flags: int, body: bytes) -> list[tuple[int, bytes]]:
        with self._lock:
            self._seq += 1
            seq = self._seq
            self.sock.send(NLMSG_HDR.pack(NLMSG_HDR.size + len(body), kind, NLM_F_REQUEST | flags, seq, 0) + body)
            replies: list[tuple[int, bytes]] = []
            while True:
                data = self.sock.recv(1 << 16)
                off = 0
                while off + NLMSG_HDR.size <= len(data):
                    length, mtype, _, mseq, _ = NLMSG_HDR.unpack_from(data, off)
                    if length < NLMSG_HDR.size:
                        raise NetlinkError(errno.EPROTO, "malformed netlink message")
                    payload = data[off + NLMSG_HDR.size:off + length]
                    off += (length + 3) & ~3
                    if mseq != seq:
                        continue  # a late answer to an earlier request that failed on our side
                    if mtype == NLMSG_ERROR:
                        code = -struct.unpack_from("=i", payload)[0]
                        if code:
                            raise NetlinkError(code)
                        return replies
                    if mtype == NLMSG_DONE:
                        return replies
                    replies.append((mtype, payload))  # an ACK or NLMSG_DONE ends the answer

    def link_up(self, index: int) -> None:
        self.request(RTM_NEWLINK, 0, IFINFOMSG.pack(socket.AF_UNSPEC, 0, index, IFF_UP, IFF_UP))

    def link_index(self, ifname: str) -> int:
        """The device's index; NetlinkError(ENODEV) when there is none of that name."""
        reply = self.request(RTM_GETLINK, 0, IFINFOMSG.pack(socket.AF_UNSPEC, 0, 0, 0, 0)
                             + _attr(IFLA_IFNAME, ifname.encode() + b"\0"))
        if len(reply) < IFINFOMSG.size:
            raise NetlinkError(errno.ENODEV, f"no answer for device {ifname}")
        return IFINFOMSG.unpack_from(reply)[2]

    def link_mtu(self, *, ifname: str | None = None, index: int = 0) -> int | None:
        """The device's MTU, by name or index; NetlinkError(ENODEV) when there is no such device."""
        reply = self.request(RTM_GETLINK, 0, IFINFOMSG.pack(socket.AF_UNSPEC, 0, index, 0, 0)
                             + (_attr(IFLA_IFNAME, ifname.encode() + b"\0") if ifname else b""))
        mtu = _attrs(reply, IFINFOMSG.size).get(IFLA_MTU)
        return struct.unpack_from("=I", mtu)[0] if mtu else None

    def default_routes(self, family: int = socket.AF_INET) -> list[tuple[int | None, int | None]]:
        """The default routes (no destination, any table, in the kernel's order; what pyroute2's
        get_default_routes returns), each as (its `mtu` metric or None, its output device's index or None)."""
        out = []
        for mtype, payload in self.dump(RTM_GETROUTE, RTMSG.pack(family, 0, 0, 0, 0, 0, 0, 0, 0)):
            if mtype != RTM_NEWROUTE:
                continue
            attrs = _attrs(payload, RTMSG.size)
            if RTA_DST in attrs:
                continue
            metric = _attrs(attrs[RTA_METRICS], 0).get(RTAX_MTU) if RTA_METRICS in attrs else None
            oif = attrs.get(RTA_OIF)
            out.append((struct.unpack_from("=I", metric)[0] if metric else None,
                        struct.unpack_from("=i", oif)[0] if oif else None))
        return out

    def addr_add(self, index: int, address: str, prefixlen: int, flags: int = 0) -> None:
        ip = ipaddress.ip_address(address)
        family = socket.AF_INET if ip.version == 4 else socket.AF_INET6
        body = IFADDRMSG.pack(family, prefixlen, flags & 0xFF, RT_SCOPE_UNIVERSE, index)
        if family == socket.AF_INET:  # as `ip addr add`: the local address and the (same) peer address
            body += _attr(IFA_LOCAL, ip.packed)
        body += _attr(IFA_ADDRESS, ip.packed)
        if flags > 0xFF:
            body += _attr(IFA_FLAGS, struct.pack("=I", flags))
        self.request(RTM_NEWADDR, NLM_F_CREATE | NLM_F_EXCL, body)

    def default_route_add(self, gateway: str, oif: int, flags: int = 0) -> None:
        """`ip route add default via GATEWAY dev OIF` (flags: rtm_flags, e.g. RTNH_F_ONLINK) in the main table,
        proto static (as pyroute2 adds it)."""
        self.route_add(None, 0, oif, gateway=gateway, flags=flags)

    def route_add(self, dst: str | None, dst_len: int, oif: int, *, gateway: str | None = None,
                  scope: int = RT_SCOPE_UNIVERSE, flags: int = 0) -> None:
        """A unicast route to dst/dst_len (None: the default route, of the gateway's family) out of `oif`."""
        addr = ipaddress.ip_address(dst) if dst else None
        gw = ipaddress.ip_address(gateway) if gateway else None
        ref = addr or gw
        family = socket.AF_INET6 if ref is not None and ref.version == 6 else socket.AF_INET
        body = RTMSG.pack(family, dst_len, 0, 0, RT_TABLE_MAIN, RTPROT_STATIC, scope, RTN_UNICAST, flags)
        if addr is not None:
            body += _attr(RTA_DST, addr.packed)
        if gw is not None:
            body += _attr(RTA_GATEWAY, gw.packed)
        body += _attr(RTA_OIF, struct.pack("=i", oif))
        self.request(RTM_NEWROUTE, NLM_F_CREATE | NLM_F_EXCL, body)


SO_NETNS_COOKIE = 71  # Linux 5.14; Python's socket module has no name for it
_local = threading.local()
# The netns larkd runs in: this module is imported (by netns.py) before anything can enter another one.
_HOME_NETNS = os.stat("/proc/thread-self/ns/net").st_ino


def netns_cookie(fd: int) -> int | None:
    """The cookie of the netns a socket belongs to (None where the kernel cannot say)."""
    sock = socket.socket(fileno=fd)
    try:
        return int.from_bytes(sock.getsockopt(socket.SOL_SOCKET, SO_NETNS_COOKIE, 8), "little")
    except OSError:
        return None
    finally:
        sock.detach()  # the descriptor stays its owner's


def beside(fd: int) -> Rtnl | None:
    """This thread's raw socket when it is in the same netns as the socket `fd` (larkd's host IPRoute), else
    None: the caller then asks through its IPRoute. Compared by netns cookie on every call. Only a thread in the
    process's netns (the one it imported this module in) gets (and keeps) one: a socket kept by a thread visiting
    a job's netns would pin that netns after the job's teardown."""
    if os.stat("/proc/thread-self/ns/net").st_ino != _HOME_NETNS:
        return None
    want = netns_cookie(fd)
    if want is None:
        return None
    mine: Rtnl | None = getattr(_local, "rtnl", None)
    if mine is None:
        _local.rtnl = mine = Rtnl()
    return mine if mine.cookie == want else None
