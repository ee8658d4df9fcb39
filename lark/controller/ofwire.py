"""OpenFlow 1.3 flow mods encoded straight to bytes, for the fields and instructions Lark's flows use.

os-ken builds a flow mod through OFPMatch, which parses every MAC and address with netaddr twice (about 50 us per
flow mod, 250 us per job, most of a registration's time in the controller: issue 26 capacity). This module packs the
same bytes with struct (tests/unit/test_controller_ofwire.py checks them against os-ken's for every kind of flow).
A match with a field it does not know is not encoded here (`encode_match` returns None) and goes through os-ken."""
from __future__ import annotations

import ipaddress
import struct
from typing import Any

OFP_VERSION, OFPT_FLOW_MOD = 4, 14
OFPFC_ADD = 0
OFP_NO_BUFFER = 0xFFFFFFFF   # out_port and out_group are 0, as os-ken sends them (an add ignores both)
OFPXMC_OPENFLOW_BASIC = 0x8000
OFPIT_GOTO_TABLE, OFPIT_WRITE_METADATA, OFPIT_APPLY_ACTIONS, OFPIT_METER = 1, 2, 4, 6
OFPAT_OUTPUT, OFPAT_SET_QUEUE = 0, 21
OFPCML_MAX = 0xFFE5   # os-ken's default max_len of an output action (only for the controller port)

_MAC, _IP4, _IP6 = "mac", "ipv4", "ipv6"
# field name -> (OXM field number, value size, kind)
FIELDS: dict[str, tuple[int, int, str]] = {
    "in_port": (0, 4, "int"), "metadata": (2, 8, "int"), "eth_dst": (3, 6, _MAC), "eth_src": (4, 6, _MAC),
    "eth_type": (5, 2, "int"), "ipv4_src": (11, 4, _IP4), "ipv4_dst": (12, 4, _IP4),
    "ipv6_src": (26, 16, _IP6), "ipv6_dst": (27, 16, _IP6),
}
_HEADER = struct.Struct("!BBHI")
_FLOW_MOD = struct.Struct("!QQBBHHHIIIH2x")   # after the header: cookie .. flags, pad


def _value(kind: str, size: int, v: Any) -> bytes:
    if kind == "int":
        return int(v).to_bytes(size, "big")
    if kind == _MAC:
        b = bytes.fromhex(str(v).replace(":", "").replace("-", ""))
        if len(b) != 6:
            raise ValueError(f"{v!r} is not a MAC address")
        return b
    return ipaddress.ip_address(v).packed if kind in (_IP4, _IP6) else b""


def encode_match(match: dict[str, Any]) -> bytes | None:
    """An OXM match (type, length, TLVs in field-number order as os-ken sorts them, padded to 8 bytes); None when a
    field is not one of FIELDS."""
    tlvs = []
    for name, v in match.items():
        spec = FIELDS.get(name)
        if spec is None:
            return None
        field, size, kind = spec
        if isinstance(v, tuple):
            body = _value(kind, size, v[0]) + _value(kind, size, v[1])
            header = (OFPXMC_OPENFLOW_BASIC << 16) | (field << 9) | (1 << 8) | (2 * size)
        else:
            body = _value(kind, size, v)
            header = (OFPXMC_OPENFLOW_BASIC << 16) | (field << 9) | size
        tlvs.append((field, struct.pack("!I", header) + body))
    tlvs.sort(key=lambda t: t[0])
    fields = b"".join(t for _, t in tlvs)
    length = 4 + len(fields)
    return struct.pack("!HH", 1, length) + fields + bytes(-length % 8)


def output(port: int) -> bytes:
    return struct.pack("!HHIH6x", OFPAT_OUTPUT, 16, port, OFPCML_MAX)


def set_queue(queue: int) -> bytes:
    return struct.pack("!HHI", OFPAT_SET_QUEUE, 8, queue)


def goto_table(table: int) -> bytes:
    return struct.pack("!HHB3x", OFPIT_GOTO_TABLE, 8, table)


def write_metadata(metadata: int, mask: int) -> bytes:
    return struct.pack("!HH4xQQ", OFPIT_WRITE_METADATA, 24, metadata, mask)


def apply_actions(*actions: bytes) -> bytes:
    body = b"".join(actions)
    return struct.pack("!HH4x", OFPIT_APPLY_ACTIONS, 8 + len(body)) + body


def meter(meter_id: int) -> bytes:
    return struct.pack("!HHI", OFPIT_METER, 8, meter_id)


class FlowMod:
    """An OFPFC_ADD flow mod as bytes, with what Datapath.set_xid and ofapp's writes use of an os-ken message: an
    xid set once, `serialize()`, `buf`."""

    __slots__ = ("body", "buf", "xid")

    def __init__(self, cookie: int, table: int, priority: int, match: bytes, instructions: bytes):
        self.body = (_FLOW_MOD.pack(cookie, 0, table, OFPFC_ADD, 0, 0, priority, OFP_NO_BUFFER, 0, 0, 0)
                     + match + instructions)
        self.xid: int | None = None
        self.buf = b""

    def set_xid(self, xid: int) -> None:
        assert self.xid is None
        self.xid = xid

    def serialize(self) -> None:
        assert self.xid is not None
        self.buf = _HEADER.pack(OFP_VERSION, OFPT_FLOW_MOD, _HEADER.size + len(self.body), self.xid) + self.body
