"""Where job ads come from: every schedd of the pool (or one) through htcondor2, a history file, and this EP's
finished-job records for jobs whose history is not written yet."""
from __future__ import annotations

import logging
import os
import re
import socket
from collections.abc import Iterator
from typing import Any

from ..errors import LarkError
from .fields import CORE_ATTRS, decode_literal, key_ids

log = logging.getLogger(__name__)


# Wanted attributes that only HTCondor or Lark write, always in this spelling (the schedd's own names; the job
# hooks' Network* and Lark*): a history file is searched for them as written, which is twice as fast as in any
# case. Every other wanted attribute (RequestBandwidth, which condor_submit writes `Requestbandwidth` from
# `request_bandwidth`; AcctGroup; the kept ones such as ProjectName) is found in any case, as ClassAd names are.
EXACT_SPELLING = frozenset([
    "GlobalJobId", "Owner", "LastRemoteHost", "RemoteHost", "CompletionDate", "EnteredCurrentStatus",
    "JobCurrentStartDate", "RemoteWallClockTime", "LarkNetworkType", "LarkBandwidthLimit",
    "NetworkIncomingBytes", "NetworkOutgoingBytes", "NetworkIncomingPackets", "NetworkOutgoingPackets",
    "NetworkIncomingAvgRate", "NetworkOutgoingAvgRate", "NetworkIncomingPeakRate", "NetworkOutgoingPeakRate",
    "ClusterId", "ProcId", "QDate", "LarkFiguresBy",
])
_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_.]*")


def _trie(words: list[tuple[str, bool]]) -> str:
    """A regex matching exactly these names (each as written, or in any case), as a trie: at each line the
    regex engine then compares a handful of first letters instead of trying every name. A name in any case
    starts with two literal branches (`R...`, `r...`), which the engine rejects as fast as an exact name;
    only its further letters are classes (`[Ee]`), tried on lines that start with the same letter."""
    root: dict = {}
    for word, any_case in words:
        for first in ({word[0].upper(), word[0].lower()} if any_case else {word[0]}):
            node = root
            for i, ch in enumerate(first + word[1:]):
                cls = any_case and i > 0 and ch.upper() != ch.lower()
                node = node.setdefault(f"[{ch.upper()}{ch.lower()}]" if cls else re.escape(ch), {})
            node[""] = {}

    def emit(node: dict) -> str:
        alts = []
        for key in sorted(k for k in node if k):
            sub, text = node[key], key
            while len(sub) == 1 and "" not in sub:    # a chain of single letters: one literal run
                (k2, sub), = sub.items()
                text += k2
            alts.append(text + emit(sub))
        if not alts:
            return ""
        body = alts[0] if len(alts) == 1 else "(?:" + "|".join(alts) + ")"
        return f"(?:{body})?" if "" in node else body
    return emit(root)


class AttrMatcher:
    """Finds the wanted attributes' lines in history-file bytes and puts their literal text into slots.

    Slot i holds names[i]; an attribute found in another spelling (`Requestbandwidth`) goes to the slot of
    its name in any case. The regex is anchored on the newline before a line, so the lines of the other
    attributes (most of a real ad's ~150) are skipped by the regex engine and never reach Python."""

    def __init__(self, names: list[str]):
        for n in names:
            if not _NAME_RE.fullmatch(n):
                raise LarkError(f"{n!r} is not a ClassAd attribute name", obj="--attr",
                                fix="give a name such as ProjectName")
        self.names = names
        self._by_lower = {n.lower().encode(): i for i, n in enumerate(names)}
        self._slot = {n.encode(): i for i, n in enumerate(dict.fromkeys(names))}   # grows with spellings met
        # A name wanted twice (a kept attribute that is also a core one): its other slots get the same value.
        self._copies = [(i, j) for i, a in enumerate(names) for j, b in enumerate(names)
                        if i != j and a.lower() == b.lower()]
        words = [(n, n not in EXACT_SPELLING) for n in dict.fromkeys(names)]
        self.pattern = re.compile(rb"\n(" + _trie(words).encode() + rb") = ([^\r\n]*)")

    def slots(self, pairs: list[tuple[bytes, bytes]]) -> list:
        vals: list = [None] * len(self.names)
        slot = self._slot
        try:
            for k, v in pairs:
                vals[slot[k]] = v
        except KeyError:   # a spelling not met before: learn it, then fill again
            for k, _ in pairs:
                if k not in slot:
                    slot[k] = self._by_lower[k.lower()]
            for k, v in pairs:
                vals[slot[k]] = v
        for i, j in self._copies:
            if vals[i] is None:
                vals[i] = vals[j]
        return vals


def history_ads(path: str, offset: int, pattern: re.Pattern, block: int = 16 << 20, stop: int | None = None
                ) -> Iterator[tuple[list[tuple[bytes, bytes]], int]]:
    """(the (name, literal) pairs `pattern` finds in the ad, file offset just after its banner) for every
    complete ad of a history file from `offset` on (to `stop`): `Attr = value` lines, each ad ended by a
    `*** ...` banner line. An ad still being written (no banner yet) is left for the next run."""
    try:
        f = open(path, "rb")  # noqa: SIM115 (a `with` below: the error here names the file and the fix)
    except OSError as e:
        raise LarkError(f"cannot read the history file: {e.strerror}", obj=path,
                        fix="give the schedd's history file (condor_config_val HISTORY) readable by you") from None
    findall = pattern.findall
    with f:
        f.seek(offset)
        # buf[0] is a newline (before the file's first line, then the one ending the last banner read), so
        # every line starts after one; buf[i] is the file's byte base + i - 1.
        buf, base = b"\n", offset
        left = -1 if stop is None else stop - offset
        while True:
            data = f.read(block if left < 0 else min(block, left))
            left -= len(data)
            if data:
                buf += data
            find = buf.find
            pos = 0
            while True:
                banner = find(b"\n***", pos)
                if banner < 0:
                    break
                eol = find(b"\n", banner + 1)
                if eol < 0:
                    break
                yield findall(buf, pos, banner), base + eol
                pos = eol
            if not data:
                return
            buf, base = buf[pos:], base + pos


def ad_boundaries(path: str, start: int, end: int, every: int) -> list[int]:
    """Offsets in [start, end) about `every` bytes apart where an ad begins (just after a banner line), to
    read the pieces between them in parallel."""
    cuts = [start]
    with open(path, "rb") as f:
        guess = start + every
        while guess < end:
            f.seek(guess - 1)
            tail = b""
            while True:
                data = f.read(1 << 20)
                if not data:
                    return cuts
                tail += data
                banner = tail.find(b"\n***")
                eol = tail.find(b"\n", banner + 1) if banner >= 0 else -1
                if eol >= 0:
                    break
            cut = guess - 1 + eol + 1
            if cut >= end:
                break
            cuts.append(cut)
            guess = cut + every
    return cuts


def read_history_file(path: str, offset: int = 0, wanted: set[str] | None = None, block: int = 16 << 20
                      ) -> Iterator[tuple[dict, int]]:
    """(ad, offset after it) for every complete ad of a history file from `offset` on, values decoded; `wanted`
    limits the attributes read (found in any case, keyed as named in `wanted`). The import uses history_ads
    and AttrMatcher directly, which skip the decoding of what a row does not use."""
    if wanted:
        names = sorted(wanted)
        m = AttrMatcher(names)
        for pairs, end in history_ads(path, offset, m.pattern, block):
            if pairs:
                yield {n: decode_literal(v.decode("utf-8", "replace"))
                       for n, v in zip(names, m.slots(pairs), strict=True) if v is not None}, end
        return
    pattern = re.compile(rb"\n([A-Za-z_][A-Za-z0-9_.]*) = ([^\r\n]*)")
    for pairs, end in history_ads(path, offset, pattern, block):
        if pairs:
            yield {k.decode(): decode_literal(v.decode("utf-8", "replace")) for k, v in pairs}, end


def history_file_identity(path: str) -> tuple[int, int]:
    """(inode, size): a new inode means the schedd rotated the file and it must be read from the start."""
    st = os.stat(path)
    return st.st_ino, st.st_size


def schedds(pool: str | None, name: str | None) -> list[tuple[str, Any]]:
    """(name, htcondor2.Schedd) of the schedds to ask: one by name, or every schedd the collector knows."""
    import htcondor2
    try:
        coll = htcondor2.Collector(pool) if pool else htcondor2.Collector()
        ads = ([coll.locate(htcondor2.DaemonType.Schedd, name)] if name
               else coll.locateAll(htcondor2.DaemonType.Schedd))
        return [(str(ad.get("Name", "")), htcondor2.Schedd(ad)) for ad in ads]
    except Exception as e:
        raise LarkError(f"cannot find the schedds: {e}", obj=f"collector {pool or '(local pool)'}",
                        fix="check COLLECTOR_HOST, or read a history file with --history-file") from None


def classad_string(text: str) -> str:
    """A ClassAd string literal (new syntax: backslash escapes)."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def since_jobs(keys: list[str]) -> str | None:
    """The `since` expression that stops a schedd's history scan at any of these jobs (row keys). By ClusterId
    and ProcId, which the owner cannot edit: a GlobalJobId edited to name a job of the last run would stop the
    scan early, at a job never read, and lose it and every job behind it."""
    ids = [i for i in map(key_ids, keys) if i is not None]
    return " || ".join(f"(ClusterId == {c} && ProcId == {p} && QDate == {q})" for c, p, q in ids) or None


def schedd_history(schedd, known: list[str], attrs: list[str]) -> Iterator[dict]:
    """History ads of one schedd, newest first, down to (not including) the first of the jobs `known` (row keys
    of the newest of the last run); all of them when none is known."""
    constraint = "NetworkIncomingBytes =!= undefined || NetworkOutgoingBytes =!= undefined"
    try:
        ads = schedd.history(constraint=constraint, projection=attrs, since=since_jobs(known))
    except Exception as e:
        raise LarkError(f"history query failed: {e}", obj="schedd",
                        fix="check that this host may read the schedd (ALLOW_READ)") from None
    for ad in ads:
        yield ad_values(ad)


def ad_values(ad) -> dict:
    """A classad2.ClassAd as plain values. History ads hold literals, which `dict()` converts in C (ten
    times faster than evaluating each attribute); the rare expression is evaluated in the ad's scope."""
    import classad2
    values = dict(ad)
    for k, v in values.items():
        if isinstance(v, classad2.ExprTree):
            try:
                v = v.eval(ad)
            except Exception:
                v = None
            values[k] = None if isinstance(v, classad2.Value) else v
    return values


def finished_records(directory: str) -> list[dict]:
    from ..daemon.records import FinishedStore
    if not os.path.isdir(directory):
        return []
    return FinishedStore(directory, keep=1 << 62).all()


def this_ep() -> str:
    return socket.getfqdn()


__all__ = [
    "CORE_ATTRS",
    "AttrMatcher",
    "ad_values",
    "finished_records",
    "history_ads",
    "history_file_identity",
    "read_history_file",
    "schedd_history",
    "schedds",
    "this_ep",
]
