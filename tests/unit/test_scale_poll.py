"""Issue 15 part B: the poller's per-pass costs: counters in one netlink dump, pins served from memory."""
import os
import struct

import pytest

from lark.config import Config
from lark.daemon.pins import Pin, PinStore
from lark.errors import LarkError
from lark.kernel.firewall import nftcounters
from lark.kernel.firewall.nftables import NftablesFirewall
from lark.kernel.sections import FirewallSection

NEWOBJ = (nftcounters.NFNL_SUBSYS_NFTABLES << 8) | nftcounters.NFT_MSG_NEWOBJ


def nlmsg(kind: int, body: bytes) -> bytes:
    size = 16 + len(body)
    return struct.pack("=IHHII", size, kind, 2, 1, 0) + body + b"\0" * (-size % 4)


def counter_msg(family: int, table: str, name: str, nbytes: int, packets: int) -> bytes:
    a = nftcounters._attr
    data = a(nftcounters.NFTA_COUNTER_BYTES, struct.pack(">Q", nbytes)) + \
        a(nftcounters.NFTA_COUNTER_PACKETS, struct.pack(">Q", packets)) + a(3, b"\0" * 4)  # PAD
    body = struct.pack("=BBH", family, 0, 0) + a(nftcounters.NFTA_OBJ_TABLE, table.encode() + b"\0") + \
        a(nftcounters.NFTA_OBJ_NAME, name.encode() + b"\0") + a(nftcounters.NFTA_OBJ_TYPE, struct.pack(">I", 1)) + \
        a(nftcounters.NFTA_OBJ_DATA | 0x8000, data)  # NLA_F_NESTED, as the kernel sends it
    return nlmsg(NEWOBJ, body)


def test_dump_request_asks_the_kernel_for_one_tables_counters_in_every_family():
    req = nftcounters.request("lark")
    size, kind, flags = struct.unpack_from("=IHH", req)
    assert size == len(req) and kind == (10 << 8) | 19 and flags == 0x301  # GETOBJ, request + dump
    assert req[16] == 0  # nfgenmsg family: NFPROTO_UNSPEC, inet and bridge in one dump
    attrs = nftcounters._attrs(req, 20, len(req))
    s, e = attrs[nftcounters.NFTA_OBJ_TABLE]
    assert req[s:e] == b"lark\0"
    s, e = attrs[nftcounters.NFTA_OBJ_TYPE]
    assert struct.unpack(">I", req[s:e]) == (1,)  # NFT_OBJECT_COUNTER


def test_dump_replies_are_parsed_across_buffers_until_done():
    out = {}
    first = counter_msg(1, "lark", "j_s1_in", 123456789012, 77) + counter_msg(7, "lark", "j_s1_in", 40, 1)
    assert nftcounters.parse(first, out) is False  # no DONE yet: read on
    assert nftcounters.parse(counter_msg(1, "lark", "j_s2_out", 5, 2) + nlmsg(3, b"\0" * 4), out) is True
    assert out == {(1, "j_s1_in"): (123456789012, 77), (7, "j_s1_in"): (40, 1), (1, "j_s2_out"): (5, 2)}


def test_dump_error_is_raised_except_for_a_missing_table():
    assert nftcounters.parse(nlmsg(2, struct.pack("=i", -2) + b"\0" * 16), {}) is True   # ENOENT: no counters
    with pytest.raises(OSError):
        nftcounters.parse(nlmsg(2, struct.pack("=i", -1) + b"\0" * 16), {})              # EPERM


def test_read_counters_sums_lark_tables_per_job_from_one_dump(monkeypatch):
    calls = []

    def fake_dump(table):
        calls.append(table)
        return {(1, "j_s1_in"): (1000, 10), (7, "j_s1_in"): (50, 1), (1, "j_s1_out"): (300, 4),
                (1, "j_s2_out"): (9, 1),
                (5, "j_s1_out"): (70, 2),          # netdev: frames sent up the uplink for a job of this EP
                (2, "j_s1_in"): (10 ** 9, 1),      # a same-named `ip` table is not Lark's
                (1, "other_counter"): (5, 5)}      # not a job counter
    monkeypatch.setattr(nftcounters, "dump", fake_dump)
    fw = NftablesFirewall(FirewallSection.from_config(Config(nft_table="larkx")))
    got = fw.read_counters()
    assert calls == ["larkx"]
    assert (got["s1"].bytes_in, got["s1"].packets_in, got["s1"].bytes_out, got["s1"].packets_out) == (1050, 11, 370, 6)
    assert (got["s2"].bytes_in, got["s2"].bytes_out) == (0, 9)
    assert set(got) == {"s1", "s2"}


def test_dump_failure_is_a_lark_error_naming_the_tables(monkeypatch):
    class Broken:
        def __init__(self, *a):
            raise PermissionError(1, "Operation not permitted")
    monkeypatch.setattr(nftcounters.socket, "socket", Broken)
    with pytest.raises(LarkError, match="cannot read the nftables counters") as e:
        nftcounters.dump("larkx")
    assert "larkx" in str(e.value)


def test_pins_are_read_from_disk_once_then_served_from_memory(tmp_path):
    store = PinStore(str(tmp_path / "pins"))
    store.save(Pin("slot1", 10, 20, 30, job_id="1.0"))
    path = store.path("slot1")
    os.chmod(path, 0)
    os.rename(path, path + ".moved")  # a read from disk would now find nothing
    assert store.load("slot1").job_id == "1.0"
    os.rename(path + ".moved", path)
    os.chmod(path, 0o600)
    # A restarted larkd (a new store) reads the file, once.
    again = PinStore(str(tmp_path / "pins"))
    first = again.load("slot1")
    assert first.job_id == "1.0" and again.load("slot1") is first
    again.drop("slot1")
    assert again.load("slot1") is None and not os.path.exists(path)
