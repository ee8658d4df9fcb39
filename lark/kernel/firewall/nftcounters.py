"""Every named counter of Lark's nftables tables in one netlink dump (NFT_MSG_GETOBJ), for the poller.

Why not libnftables: `list counters table ...` makes libnftables fetch every chain and rule of the table into its
cache first; with 128 jobs that took ~8 ms of CPU per table, two tables per pass (measured with bench/scale128.py).
Why not pyroute2: its NFTSocket has no message class for objects, and with one added its generic decoder took
~50 ms for the same 256 counters. The dump asked here is filtered by the kernel (table name, counter type, all
families at once) and its replies are fixed-layout: a netlink header, nfgenmsg and a few attributes.
"""
from __future__ import annotations

import os
import socket
import struct

from ...errors import LarkError

NETLINK_NETFILTER = 12
NFNL_SUBSYS_NFTABLES = 10
NFT_MSG_NEWOBJ = 18
NFT_MSG_GETOBJ = 19
NLM_F_REQUEST, NLM_F_DUMP = 0x1, 0x300
NLMSG_ERROR, NLMSG_DONE = 2, 3
NFTA_OBJ_TABLE, NFTA_OBJ_NAME, NFTA_OBJ_TYPE, NFTA_OBJ_DATA = 1, 2, 3, 4
NFTA_COUNTER_BYTES, NFTA_COUNTER_PACKETS = 1, 2
NFT_OBJECT_COUNTER = 1
# NFPROTO_INET, NFPROTO_NETDEV, NFPROTO_BRIDGE: the families of Lark's tables (a same-named ip table is not ours).
# The netdev table holds the `_out` counter of a job's frames sent up the uplink for another job of this EP
# (same_ep.py): without it the poller missed hairpinned bytes until teardown read them (issue 23 item 11).
LARK_FAMILIES = (1, 5, 7)
NLA_TYPE_MASK = 0x3FFF  # without the nested / byte-order flags
_HDR = struct.Struct("=IHHII")
_NLA = struct.Struct("=HH")


def _attr(kind: int, payload: bytes) -> bytes:
    size = _NLA.size + len(payload)
    return _NLA.pack(size, kind) + payload + b"\0" * (-size % 4)


def request(table: str, seq: int = 1) -> bytes:
    """A dump request for the counters of `table` in every family (nfgenmsg family 0 = NFPROTO_UNSPEC)."""
    body = struct.pack("=BBH", 0, 0, 0) + _attr(NFTA_OBJ_TABLE, table.encode() + b"\0") + \
        _attr(NFTA_OBJ_TYPE, struct.pack(">I", NFT_OBJECT_COUNTER))
    return _HDR.pack(_HDR.size + len(body), (NFNL_SUBSYS_NFTABLES << 8) | NFT_MSG_GETOBJ,
                     NLM_F_REQUEST | NLM_F_DUMP, seq, 0) + body


def _attrs(data: bytes, start: int, end: int) -> dict[int, tuple[int, int]]:
    """Attribute type -> (payload start, payload end) within data[start:end]."""
    out = {}
    while start + _NLA.size <= end:
        size, kind = _NLA.unpack_from(data, start)
        if size < _NLA.size:
            break
        out[kind & NLA_TYPE_MASK] = (start + _NLA.size, start + size)
        start += (size + 3) & ~3
    return out


def parse(data: bytes, out: dict[tuple[int, str], tuple[int, int]]) -> bool:
    """Add the counters in one recv()'d buffer to `out` ((family, name) -> (bytes, packets)); True at the dump's end."""
    off = 0
    while off + _HDR.size <= len(data):
        length, kind, _flags, _seq, _pid = _HDR.unpack_from(data, off)
        if length < _HDR.size:
            break
        if kind == NLMSG_DONE:
            return True
        if kind == NLMSG_ERROR:
            err = -struct.unpack_from("=i", data, off + _HDR.size)[0]
            if err == 0:
                return True
            if err == 2:  # ENOENT: the table does not exist (yet, or any more): no counters
                return True
            raise OSError(err, os.strerror(err))
        if kind == (NFNL_SUBSYS_NFTABLES << 8) | NFT_MSG_NEWOBJ:
            family = data[off + _HDR.size]
            a = _attrs(data, off + _HDR.size + 4, off + length)
            if NFTA_OBJ_NAME in a and NFTA_OBJ_DATA in a:
                s, e = a[NFTA_OBJ_NAME]
                name = data[s:e].rstrip(b"\0").decode()
                c = _attrs(data, *a[NFTA_OBJ_DATA])
                b = struct.unpack_from(">Q", data, c[NFTA_COUNTER_BYTES][0])[0] if NFTA_COUNTER_BYTES in c else 0
                p = struct.unpack_from(">Q", data, c[NFTA_COUNTER_PACKETS][0])[0] if NFTA_COUNTER_PACKETS in c else 0
                out[(family, name)] = (b, p)
        off += (length + 3) & ~3
    return False


def dump(table: str) -> dict[tuple[int, str], tuple[int, int]]:
    """Every counter of the tables named `table` (inet and bridge alike), read in the calling thread's netns."""
    out: dict[tuple[int, str], tuple[int, int]] = {}
    try:
        with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_NETFILTER) as s:
            s.bind((0, 0))
            s.sendall(request(table))
            while not parse(s.recv(1 << 17), out):
                pass
    except OSError as e:
        raise LarkError(f"cannot read the nftables counters: {e.strerror or e}", obj=f"nft tables {table}",
                        fix="check that larkd runs as root and nf_tables is loaded (`lark doctor`)") from None
    return out
