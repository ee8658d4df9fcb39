"""The raw socket's tc requests (lark/kernel/rtnl.py Rtnl.tc, used by shaping.py) are the bytes pyroute2's tcmsg
encodes for the same request, while their options are encoded once per distinct value. No kernel: the socket's
send is captured."""
from __future__ import annotations

import threading

import pytest
from pyroute2.netlink import NLM_F_ACK, NLM_F_CREATE, NLM_F_EXCL, NLM_F_REPLACE, NLM_F_REQUEST
from pyroute2.netlink.rtnl import RTM_NEWQDISC, RTM_NEWTCLASS
from pyroute2.netlink.rtnl.tcmsg import sched_htb, tcmsg

from lark.kernel import rtnl, shaping


class Sent(rtnl.Rtnl):
    """An Rtnl whose requests are kept instead of sent (and answered with a bare ACK)."""

    def __init__(self) -> None:  # no socket
        self._seq = 0
        self.sent: list[bytes] = []
        self._lock = threading.Lock()

    def _exchange(self, kind, flags, msg, parser=None):  # type: ignore[no-untyped-def]
        self._seq += 1
        msg["header"]["type"] = kind
        msg["header"]["flags"] = NLM_F_REQUEST | flags
        msg["header"]["sequence_number"] = self._seq
        msg.encode()
        self.sent.append(bytes(msg.data))
        return []


def pyroute2_bytes(kind: int, flags: int, seq: int, index: int, handle: int, parent: int, options: dict) -> bytes:
    msg = tcmsg()
    msg["family"] = 0
    msg["index"] = index
    msg["handle"] = handle
    msg["parent"] = parent
    msg["attrs"] = [("TCA_KIND", "htb"), ("TCA_OPTIONS", options)]
    msg["header"]["type"] = kind
    msg["header"]["flags"] = NLM_F_REQUEST | NLM_F_ACK | flags
    msg["header"]["sequence_number"] = seq
    msg.encode()
    return bytes(msg.data)


def class_options(mbit: float) -> dict:
    limit = shaping.limit_for(mbit)
    return sched_htb.get_class_parameters({"rate": f"{limit.rate_bit}bit", "ceil": f"{limit.rate_bit}bit",
                                           "burst": limit.burst, "cburst": limit.burst, "quantum": 1514})


@pytest.mark.parametrize("mbit", [1, 100, 40_000])   # 40 Gbit/s: the 64-bit rate attributes
def test_each_request_is_the_bytes_pyroute2_encodes(mbit: float) -> None:
    raw = Sent()
    root = sched_htb.get_parameters({"default": 1})
    requests = [(RTM_NEWQDISC, NLM_F_CREATE | NLM_F_EXCL, 7, 0x10000, 0xFFFFFFFF, root),
                (RTM_NEWTCLASS, NLM_F_CREATE | NLM_F_EXCL, 7, 0x10001, 0x10000, class_options(mbit)),
                (RTM_NEWTCLASS, NLM_F_CREATE | NLM_F_EXCL, 9, 0x10001, 0x10000, class_options(mbit)),  # cached
                (RTM_NEWTCLASS, NLM_F_REPLACE, 9, 0x10001, 0x10000, class_options(mbit * 2))]
    for kind, flags, index, handle, parent, options in requests:
        raw.tc(kind, flags, index, handle, parent, "htb", options)
    want = [pyroute2_bytes(kind, flags, seq, index, handle, parent, options)
            for seq, (kind, flags, index, handle, parent, options) in enumerate(requests, 1)]
    assert raw.sent == want


def test_options_are_encoded_once_per_value(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(rtnl, "_options_cache", {})
    encodes = []
    real = tcmsg.encode

    def counted(self):  # type: ignore[no-untyped-def]
        encodes.append(1)
        return real(self)

    monkeypatch.setattr(tcmsg, "encode", counted)
    raw = Sent()
    for _ in range(3):
        raw.tc(RTM_NEWTCLASS, NLM_F_CREATE | NLM_F_EXCL, 3, 0x10001, 0x10000, "htb", class_options(100))
    assert len(encodes) == 1
    raw.tc(RTM_NEWTCLASS, NLM_F_CREATE | NLM_F_EXCL, 3, 0x10001, 0x10000, "htb", class_options(200))
    assert len(encodes) == 2


def test_the_cache_stays_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(rtnl, "_options_cache", {})
    monkeypatch.setattr(rtnl, "_OPTIONS_CACHE_MAX", 4)
    raw = Sent()
    for mbit in range(1, 11):
        raw.tc(RTM_NEWTCLASS, NLM_F_CREATE | NLM_F_EXCL, 3, 0x10001, 0x10000, "htb", class_options(mbit))
    assert 0 < len(rtnl._options_cache) <= 4
