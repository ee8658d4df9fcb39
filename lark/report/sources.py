"""Where job ads come from: every schedd of the pool (or one) through htcondor2, a history file, and this EP's
finished-job records for jobs whose history is not written yet."""
from __future__ import annotations

import logging
import os
import re
import socket
from typing import Any, Iterator

from ..errors import LarkError
from .fields import CORE_ATTRS, RawAd, decode_literal

log = logging.getLogger(__name__)


def _line_pattern(wanted: set[str] | None) -> re.Pattern:
    """A wanted attribute's line. Anchored on the newline before it (a literal the regex engine scans for
    quickly), so the lines of other attributes, most of a real history ad, never reach Python."""
    names = "|".join(sorted(map(re.escape, wanted))) if wanted else r"[A-Za-z_][A-Za-z0-9_.]*"
    return re.compile(r"\n(" + names + r") = ([^\r\n]*)")


def read_history_file(path: str, offset: int = 0, wanted: set[str] | None = None, raw: bool = False,
                      block: int = 8 << 20) -> Iterator[tuple[dict, int]]:
    """(ad, offset) for every complete ad in a history file from `offset` on, where offset is the end of the
    block of complete ads it came in; an ad still being written (no banner yet) is left for the next run.
    `wanted` limits the attributes read. With `raw`, values stay ClassAd literal text (a fields.RawAd, which
    the row builder decodes only where it needs to), else they are decoded."""
    try:
        f = open(path, "rb")
    except OSError as e:
        raise LarkError(f"cannot read the history file: {e.strerror}", obj=path,
                        fix="give the schedd's history file (condor_config_val HISTORY) readable by you") from None
    pattern = _line_pattern(wanted)
    with f:
        f.seek(offset)
        pos = offset        # file offset of buf[0]
        buf = b""
        while True:
            data = f.read(block)
            buf += data
            # Work up to the end of the last complete banner line; the rest waits for more data.
            cut = buf.rfind(b"\n***")
            if cut < 0 and buf.startswith(b"***"):
                cut = 0
            eol = buf.find(b"\n", cut + 1) if cut >= 0 else -1
            if eol >= 0:
                end = pos + eol + 1
                # Split into ads at the banners, then pick each ad's wanted lines: both in C.
                for piece in ("\n" + buf[:eol].decode("utf-8", "replace")).split("\n***"):
                    ad = RawAd(pattern.findall(piece))
                    if ad:
                        yield (ad if raw else {k: decode_literal(v) for k, v in ad.items()}), end
                pos = end
                buf = buf[eol + 1:]
            if not data:
                return


def history_file_identity(path: str) -> tuple[int, int]:
    """(inode, size): a new inode means the schedd rotated the file and it must be read from the start."""
    st = os.stat(path)
    return st.st_ino, st.st_size


def schedds(pool: str | None, name: str | None) -> list[tuple[str, Any]]:
    """(name, htcondor2.Schedd) of the schedds to ask: one by name, or every schedd the collector knows."""
    import htcondor2
    try:
        coll = htcondor2.Collector(pool) if pool else htcondor2.Collector()
        if name:
            ads = [coll.locate(htcondor2.DaemonType.Schedd, name)]
        else:
            ads = coll.locateAll(htcondor2.DaemonType.Schedd)
        return [(str(ad.get("Name", "")), htcondor2.Schedd(ad)) for ad in ads]
    except Exception as e:
        raise LarkError(f"cannot find the schedds: {e}", obj=f"collector {pool or '(local pool)'}",
                        fix="check COLLECTOR_HOST, or read a history file with --history-file") from None


def schedd_history(schedd, since_time: int | None, attrs: list[str]) -> Iterator[dict]:
    """History ads of one schedd, newest first, down to (not including) jobs that left the queue before
    `since_time`; overlap with the previous run is harmless (the cache is keyed by GlobalJobId)."""
    constraint = "NetworkIncomingBytes =!= undefined || NetworkOutgoingBytes =!= undefined"
    since = f"EnteredCurrentStatus < {int(since_time)}" if since_time else None
    try:
        ads = schedd.history(constraint=constraint, projection=attrs, since=since)
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


__all__ = ["CORE_ATTRS", "read_history_file", "history_file_identity", "schedds", "schedd_history",
           "ad_values", "finished_records", "this_ep"]
