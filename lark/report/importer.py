"""Bring new history into the cache: only what the last run did not read, per source."""
from __future__ import annotations

import logging
import multiprocessing
import os
from typing import Iterable, Iterator, Mapping

from . import sources
from .cache import Cache
from .fields import CORE_ATTRS, Row, extra_attributes, row_from_ad, row_from_finished, row_from_literals

log = logging.getLogger(__name__)
# How many of the newest jobs a run read from a schedd the next run stops at (any one of them still in the
# history is enough; several, in case the newest was taken out of the history by hand).
SCHEDD_HEAD = 8


# A history file this much larger than what the last run read is parsed by worker processes, one piece each
# (parsing is most of an import's time; the cache is written by this process while they parse the next).
PARALLEL_MIN_BYTES = 64 << 20
PIECE_BYTES = 32 << 20


def _workers() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


_matchers: dict[tuple[str, ...], sources.AttrMatcher] = {}


def parse_piece(path: str, start: int, stop: int | None, extra: list[str]) -> tuple[list[tuple], int]:
    """Cache rows of the complete ads of a history file in [start, stop), and the offset after the last."""
    names = tuple(CORE_ATTRS + extra)
    matcher = _matchers.get(names) or _matchers.setdefault(names, sources.AttrMatcher(list(names)))
    slots, end, rows = matcher.slots, start, []
    for pairs, end in sources.history_ads(path, start, matcher.pattern, stop=stop):
        r = row_from_literals(slots(pairs), "history", extra)
        if r is not None:
            rows.append(r)
    return rows, end


def _parse_piece(args: tuple) -> tuple[list[tuple], int]:
    return parse_piece(*args)


def import_history_file(cache: Cache, path: str, extra_attrs: list[str] | None = None,
                        workers: int | None = None) -> int:
    """Read a history file from where the last run stopped (from the start if the schedd rotated it)."""
    extra = extra_attributes(extra_attrs)
    sources.AttrMatcher(CORE_ATTRS + extra)   # a bad --attr fails here, before any worker starts
    inode, size = sources.history_file_identity(path)
    key = f"file:{os.path.abspath(path)}"
    mark = cache.mark(key)
    offset = mark[1] if mark and mark[0] == inode and mark[1] <= size else 0
    workers = _workers() if workers is None else workers
    last = [offset]
    if workers < 2 or size - offset < PARALLEL_MIN_BYTES:
        rows, last[0] = parse_piece(path, offset, None, extra)
        cache.add(rows)
    else:
        cuts = sources.ad_boundaries(path, offset, size, PIECE_BYTES)
        pieces = [(path, a, b, extra) for a, b in zip(cuts, cuts[1:] + [None])]
        log.info("reading %s from byte %d in %d pieces, %d processes", path, offset, len(pieces), workers)
        # fork: the workers need nothing but this module (spawn and forkserver would run the caller's main
        # module again); they never touch the cache this process has open, and this process has no threads.
        with multiprocessing.get_context("fork").Pool(workers) as pool:
            def rows() -> Iterator[tuple]:
                for got, end in pool.imap(_parse_piece, pieces):   # in file order: a later ad replaces
                    last[0] = max(last[0], end)
                    yield from got
            cache.add(rows())
    cache.set_mark(key, inode, last[0])
    return cache.count()


def import_ads(cache: Cache, ads: Iterable[Mapping], extra_attrs: list[str] | None = None,
               head: int = SCHEDD_HEAD) -> tuple[int, list[str]]:
    """Job ads as plain mappings (sources.ad_values of what htcondor2 returns, newest first) into the cache;
    returns (ads read, GlobalJobIds of the first `head` of them)."""
    extra = extra_attributes(extra_attrs)
    first: list[str] = []
    n = [0]

    def rows() -> Iterator[Row]:
        for ad in ads:
            n[0] += 1
            r = row_from_ad(ad, "history", extra)
            if r is not None:
                if len(first) < head:
                    first.append(r.gid)
                yield r

    cache.add(rows())
    return n[0], first


def import_schedds(cache: Cache, pool: str | None = None, name: str | None = None,
                   extra_attrs: list[str] | None = None) -> int:
    """Read every schedd's (or one schedd's) history written since the last run; returns ads read.

    A schedd answers newest first, in the order jobs entered its history, and stops where `since` becomes
    true: at the newest jobs the last run read. Not at a time: a job can enter the history long after its
    EnteredCurrentStatus or CompletionDate (spooled output, leave_in_queue, a removal), and a time mark would
    stop the scan at it and lose it and every job behind it. If none of those jobs is there any more (the
    history was cleared), everything is read again; re-read jobs replace themselves (same GlobalJobId)."""
    attrs = CORE_ATTRS + extra_attributes(extra_attrs)
    total = 0
    for sname, schedd in sources.schedds(pool, name):
        key = f"schedd:{sname}"
        known = cache.heads(key)
        n, first = import_ads(cache, sources.schedd_history(schedd, known, attrs), extra_attrs)
        total += n
        if first:
            cache.set_heads(key, first)
        log.info("read %d new history ads from schedd %s", n, sname)
    return total


def import_finished(cache: Cache, directory: str, ep: str | None = None) -> int:
    """This EP's finished-job records: they count until the job's history arrives, and never after."""
    ep = ep or sources.this_ep()
    recs = sources.finished_records(directory)
    rows = [r for r in (row_from_finished(rec, ep) for rec in recs) if r is not None]
    if len(rows) < len(recs):
        log.info("%d finished records carry no GlobalJobId and are left to the job history", len(recs) - len(rows))
    return cache.add(rows)
