"""The fixed rtnetlink requests of a job's setup, on a plain netlink socket.

pyroute2 0.9 runs an asyncio event loop for every request: ~0.16 ms for `ip link set lo up`, which the kernel
does in ~0.004 ms on a raw socket (measured on this 2-vCPU VM), and ~0.5 ms to make and close an IPRoute in a
job's netns. A NAT job's setup sent about ten such requests (in the job's netns: lo up, the device's index, the
device up, its address, its default route; on the host: the MTU of the route out, the gateway address and the
host route), so they go through this module. Everything else still uses pyroute2 (netns.JobNetlink makes the
job netns's IPRoute only when something asks for it; `beside` gives a raw socket only in the netns of the caller's
IPRoute).

Each request waits for its acknowledgement; a kernel error raises pyroute2's NetlinkError with the same code, so
callers handle both paths alike. Only the transport is ours (one socket, send, receive until the answer to our
sequence number); every request is encoded and every answer decoded by pyroute2's own message classes
(ifinfmsg, ifaddrmsg, rtmsg, tcmsg through its MarshalRtnl), attributes by their pyroute2 names; a qdisc's or
class's options as pyroute2's tc plugin for its kind builds them (shaping.py).
"""
from __future__ import annotations

import errno
import ipaddress
import os
import socket
import threading
from collections.abc import Callable

from pyroute2.iproute.parsers import default_routes, get_header
from pyroute2.netlink import (
    NETLINK_ROUTE,
    NLM_F_ACK,
    NLM_F_CREATE,
    NLM_F_DUMP,
    NLM_F_ECHO,
    NLM_F_EXCL,
    NLM_F_REQUEST,
    NLMSG_DONE,
    NLMSG_ERROR,
    nlmsg,
)
from pyroute2.netlink.exceptions import NetlinkDecodeError, NetlinkError
from pyroute2.netlink.rtnl import (
    RTM_GETLINK,
    RTM_GETROUTE,
    RTM_NEWADDR,
    RTM_NEWLINK,
    RTM_NEWROUTE,
    rt_proto,
    rt_type,
)
from pyroute2.netlink.rtnl.ifaddrmsg import ifaddrmsg
from pyroute2.netlink.rtnl.ifinfmsg import IFF_UP, ifinfmsg
from pyroute2.netlink.rtnl.marshal import MarshalRtnl
from pyroute2.netlink.rtnl.rtmsg import RT_SCOPE_UNIVERSE, rtmsg
from pyroute2.netlink.rtnl.tcmsg import tcmsg

RT_TABLE_MAIN = 254  # the kernel's main table (rt_class_t); pyroute2 has no name for it
Parser = Callable[[bytes, int, int], "nlmsg | None"]
IFA_FLAGS_IN_HEADER = 0xFF  # ifaddrmsg's flags field is 8 bits: larger flags go in IFA_FLAGS, as `ip` does


class Rtnl:
    """A raw rtnetlink socket in the netns of the thread that makes it (it stays there)."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_CLOEXEC, NETLINK_ROUTE)
        self.sock.bind((0, 0))
        self._seq = 0
        self._lock = threading.Lock()
        self._marshal = MarshalRtnl()
        self.cookie = netns_cookie(self.sock.fileno())

    def close(self) -> None:
        self.sock.close()

    def request(self, kind: int, flags: int, msg: nlmsg) -> nlmsg | None:
        """Send one request (a pyroute2 message; its header is filled here) and wait for its answer: the reply
        message, decoded by pyroute2 (None for a bare ACK)."""
        replies = self._exchange(kind, NLM_F_ACK | flags, msg)
        return replies[-1] if replies else None

    def dump(self, kind: int, msg: nlmsg, parser: Parser | None = None) -> list[nlmsg]:
        """A dump request: every message of the answer, decoded by pyroute2 (their type in msg['header']), or by
        `parser` (pyroute2's parser signature: data, offset, length -> message, or None to skip one)."""
        return self._exchange(kind, NLM_F_DUMP, msg, parser)

    def _exchange(self, kind: int, flags: int, msg: nlmsg, parser: Parser | None = None) -> list[nlmsg]:
        with self._lock:
            self._seq += 1
            seq = self._seq
            msg["header"]["type"] = kind
            msg["header"]["flags"] = NLM_F_REQUEST | flags
            msg["header"]["sequence_number"] = seq
            msg.encode()
            if parser is not None:
                self._marshal.seq_map[seq] = self._or_error(parser)
            try:
                self.sock.send(msg.data)
                return self._answer(seq)
            finally:
                self._marshal.seq_map.pop(seq, None)

    def _or_error(self, parser: Parser) -> Parser:
        """`parser` for the answer's messages, pyroute2's own decoding for an error (it may come instead)."""
        def parse(data: bytes, offset: int, length: int) -> nlmsg | None:
            header = get_header(data, offset)
            if header["type"] == NLMSG_ERROR:
                return self._marshal.parse_one_message(NLMSG_ERROR, header["flags"], header["sequence_number"],
                                                       data, offset, length)
            return parser(data, offset, length)
        return parse

    def _answer(self, seq: int) -> list[nlmsg]:
        """Receive until the ACK, error or NLMSG_DONE of request `seq`: the messages before it."""
        replies: list[nlmsg] = []
        while True:
            for reply in self._marshal.parse(self.sock.recv(1 << 16)):
                header = reply["header"]
                if header.get("sequence_number") != seq:
                    continue  # a late answer to an earlier request that failed on our side
                if isinstance(header.get("error"), NetlinkDecodeError):
                    raise NetlinkError(errno.EPROTO, f"malformed netlink answer: {header['error']}")
                if header["type"] == NLMSG_ERROR:
                    if reply["error"]:
                        raise NetlinkError(-reply["error"])
                    return replies
                if header["type"] == NLMSG_DONE:
                    return replies
                replies.append(reply)

    def link_up(self, index: int) -> None:
        msg = ifinfmsg()
        msg["family"] = socket.AF_UNSPEC
        msg["index"] = index
        msg["flags"] = msg["change"] = IFF_UP
        self.request(RTM_NEWLINK, 0, msg)

    def _link(self, ifname: str | None, index: int) -> nlmsg | None:
        msg = ifinfmsg()
        msg["family"] = socket.AF_UNSPEC
        msg["index"] = index
        if ifname:
            msg["attrs"] = [("IFLA_IFNAME", ifname)]
        return self.request(RTM_GETLINK, 0, msg)

    def link_index(self, ifname: str) -> int:
        """The device's index; NetlinkError(ENODEV) when there is none of that name."""
        reply = self._link(ifname, 0)
        if reply is None:
            raise NetlinkError(errno.ENODEV, f"no answer for device {ifname}")
        return int(reply["index"])

    def link_mtu(self, *, ifname: str | None = None, index: int = 0) -> int | None:
        """The device's MTU, by name or index; NetlinkError(ENODEV) when there is no such device."""
        reply = self._link(ifname, index)
        mtu = reply.get_attr("IFLA_MTU") if reply is not None else None
        return int(mtu) if mtu is not None else None

    def default_routes(self, family: int = socket.AF_INET) -> list[tuple[int | None, int | None]]:
        """The default routes (no destination, any table, in the kernel's order; what pyroute2's
        get_default_routes returns), each as (its `mtu` metric or None, its output device's index or None)."""
        query = rtmsg()
        query["family"] = family
        out = []
        # pyroute2's own parser for this (as its get_default_routes): decodes only the messages without RTA_DST,
        # so a host with a route per job does not decode every job's route on every setup.
        for route in self.dump(RTM_GETROUTE, query, default_routes):
            if route["header"]["type"] != RTM_NEWROUTE or route.get_attr("RTA_DST") is not None:
                continue
            metrics = route.get_attr("RTA_METRICS")
            metric = metrics.get_attr("RTAX_MTU") if metrics is not None else None
            oif = route.get_attr("RTA_OIF")
            out.append((int(metric) if metric is not None else None, int(oif) if oif is not None else None))
        return out

    def veth_add(self, ifname: str, peer: str, peer_ns_fd: int, *, peer_address: str | None = None,
                 mtu: int | None = None) -> tuple[int, int]:
        """`ip link add IFNAME [mtu M] up type veth peer name PEER netns FD [address A] [mtu M]`, one request: the
        two ends' indexes (this end's here, the peer's in its netns). They come from the kernel's NLM_F_ECHO of the
        new device (Linux 6.3+), so nothing is read back by name; a kernel that does not echo gets one RTM_GETLINK.
        """
        peer_attrs: list[tuple[str, object]] = [("IFLA_IFNAME", peer), ("IFLA_NET_NS_FD", peer_ns_fd)]
        if peer_address:
            peer_attrs.append(("IFLA_ADDRESS", peer_address))
        attrs: list[tuple[str, object]] = [("IFLA_IFNAME", ifname)]
        if mtu:
            peer_attrs.append(("IFLA_MTU", mtu))
            attrs.append(("IFLA_MTU", mtu))
        attrs.append(("IFLA_LINKINFO", {"attrs": [
            ("IFLA_INFO_KIND", "veth"),
            ("IFLA_INFO_DATA", {"attrs": [("VETH_INFO_PEER", {"attrs": peer_attrs})]})]}))
        msg = ifinfmsg()
        msg["family"] = socket.AF_UNSPEC
        msg["flags"] = msg["change"] = IFF_UP
        msg["attrs"] = attrs
        echo = self.request(RTM_NEWLINK, NLM_F_CREATE | NLM_F_EXCL | NLM_F_ECHO, msg)
        if echo is None or echo["header"]["type"] != RTM_NEWLINK or echo.get_attr("IFLA_IFNAME") != ifname:
            echo = self._link(ifname, 0)  # no echo (Linux < 6.3): the new device by name
            if echo is None:
                raise NetlinkError(errno.ENODEV, f"no answer for the new device {ifname}")
        index = int(echo["index"])
        # IFLA_LINK is the peer's index; the kernel leaves it out when it equals the device's own (nla_put_iflink).
        link = echo.get_attr("IFLA_LINK")
        return index, int(link) if link is not None else index

    def addr_add(self, index: int, address: str, prefixlen: int, flags: int = 0) -> None:
        ip = ipaddress.ip_address(address)
        msg = ifaddrmsg()
        msg["family"] = socket.AF_INET if ip.version == 4 else socket.AF_INET6
        msg["prefixlen"] = prefixlen
        msg["flags"] = flags & IFA_FLAGS_IN_HEADER
        msg["scope"] = RT_SCOPE_UNIVERSE
        msg["index"] = index
        attrs: list[tuple[str, object]] = []
        if ip.version == 4:  # as `ip addr add`: the local address and the (same) peer address
            attrs.append(("IFA_LOCAL", str(ip)))
        attrs.append(("IFA_ADDRESS", str(ip)))
        if flags > IFA_FLAGS_IN_HEADER:
            attrs.append(("IFA_FLAGS", flags))
        msg["attrs"] = attrs
        self.request(RTM_NEWADDR, NLM_F_CREATE | NLM_F_EXCL, msg)

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
        msg = rtmsg()
        msg["family"] = socket.AF_INET6 if ref is not None and ref.version == 6 else socket.AF_INET
        msg["dst_len"] = dst_len
        msg["table"] = RT_TABLE_MAIN
        msg["proto"] = rt_proto["static"]
        msg["scope"] = scope
        msg["type"] = rt_type["unicast"]
        msg["flags"] = flags
        attrs: list[tuple[str, object]] = []
        if addr is not None:
            attrs.append(("RTA_DST", str(addr)))
        if gw is not None:
            attrs.append(("RTA_GATEWAY", str(gw)))
        attrs.append(("RTA_OIF", oif))
        msg["attrs"] = attrs
        self.request(RTM_NEWROUTE, NLM_F_CREATE | NLM_F_EXCL, msg)

    def tc(self, kind: int, flags: int, index: int, handle: int, parent: int, tc_kind: str,
           options: dict) -> None:
        """A qdisc or class request (kind: RTM_NEWQDISC, RTM_NEWTCLASS...; flags as pyroute2's tc commands set
        them, e.g. NLM_F_CREATE | NLM_F_EXCL for "add") on device `index`; `options`: TCA_OPTIONS as the kind's
        pyroute2 plugin returns them (its get_parameters / get_class_parameters), encoded by pyroute2's tcmsg."""
        msg = _tcmsg_options_encoded()
        msg["family"] = socket.AF_UNSPEC
        msg["index"] = index
        msg["handle"] = handle
        msg["parent"] = parent
        msg["attrs"] = [("TCA_KIND", tc_kind), ("TCA_OPTIONS", _encoded_options(tc_kind, options))]
        self.request(kind, flags, msg)


class _tcmsg_options_encoded(nlmsg):
    """pyroute2's tcmsg (its fields, its first attributes) with TCA_OPTIONS as bytes pyroute2 encoded earlier (its
    cdata type). Not a subclass of tcmsg: pyroute2 compiles a class's nla_map once and a subclass inherits it."""
    prefix = tcmsg.prefix
    fields = tcmsg.fields
    nla_map = (("TCA_UNSPEC", "none"), ("TCA_KIND", "asciiz"), ("TCA_OPTIONS", "cdata"))


_OPTIONS_CACHE_MAX = 256
_options_cache: dict[str, bytes] = {}


def _encoded_options(tc_kind: str, options: dict) -> bytes:
    """TCA_OPTIONS of a `tc_kind` qdisc or class as pyroute2's tcmsg encodes them, once per distinct value: an HTB
    class's options carry the rate and ceil tables, which pyroute2 computes in Python (~0.5 ms a message, measured;
    the kernel takes ~0.05 ms to add the class), and a host's jobs mostly share a few limits."""
    key = repr((tc_kind, options))
    blob = _options_cache.get(key)
    if blob is None:
        full = tcmsg()
        full["attrs"] = [("TCA_KIND", tc_kind), ("TCA_OPTIONS", options)]
        full.encode()
        split = _tcmsg_options_encoded(full.data)
        split.decode()
        blob = split.get_attr("TCA_OPTIONS")
        if len(_options_cache) >= _OPTIONS_CACHE_MAX:  # fair shares move with every job: keep it bounded
            _options_cache.clear()
        _options_cache[key] = blob
    return blob


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
