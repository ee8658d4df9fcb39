"""Where job ads come from: every schedd of the pool (or one) through htcondor2, a history file, and this EP's
finished-job records for jobs whose history is not written yet."""
from __future__ import annotations

import logging
import os
import socket
from typing import Any, Iterator

from ..errors import LarkError
from .fields import CORE_ATTRS

log = logging.getLogger(__name__)
BANNER = "***"   # HTCondor ends every ad in a history file with a `*** ProcId = ... ClusterId = ...` line


def _literal(text: str) -> Any:
    """The value of one right-hand side of an old-syntax ClassAd line.

    Integers, reals and strings without escapes (nearly every value in a history file) are decoded here,
    because going through the ClassAd parser for each of millions of values is what would make a large
    import slow; anything else (escaped strings, booleans, expressions, lists) goes to classad2.
    """
    if text and text[0] == '"':
        if text[-1] == '"' and "\\" not in text and text.count('"') == 2:
            return text[1:-1]
    else:
        try:
            return int(text)
        except ValueError:
            try:
                return float(text)
            except ValueError:
                pass
    import classad2
    try:
        value = classad2.ExprTree(text).eval()
    except Exception:
        return text
    return None if isinstance(value, classad2.Value) else value   # Undefined / Error


def read_history_file(path: str, offset: int = 0, wanted: set[str] | None = None
                      ) -> Iterator[tuple[dict, int]]:
    """(ad, offset just after it) for every complete ad in a history file from `offset` on; an ad still
    being written (no banner yet) is left for the next run. `wanted` limits the attributes decoded."""
    try:
        f = open(path, "rb")
    except OSError as e:
        raise LarkError(f"cannot read the history file: {e.strerror}", obj=path,
                        fix="give the schedd's history file (condor_config_val HISTORY) readable by you") from None
    with f:
        f.seek(offset)
        ad: dict = {}
        pos = offset
        for raw in f:
            pos += len(raw)
            if raw.startswith(b"***"):
                if ad:
                    yield ad, pos
                ad = {}
                continue
            name, sep, value = raw.decode("utf-8", "replace").partition(" = ")
            if not sep or (wanted is not None and name not in wanted):
                continue
            ad[name] = _literal(value.rstrip("\r\n"))


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
        yield {k: ad.eval(k) if k in ad else None for k in attrs}


def finished_records(directory: str) -> list[dict]:
    from ..daemon.records import FinishedStore
    if not os.path.isdir(directory):
        return []
    return FinishedStore(directory, keep=1 << 62).all()


def this_ep() -> str:
    return socket.getfqdn()


__all__ = ["CORE_ATTRS", "read_history_file", "history_file_identity", "schedds", "schedd_history",
           "finished_records", "this_ep"]
