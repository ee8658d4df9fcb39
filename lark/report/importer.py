"""Bring new history into the cache: only what the last run did not read, per source."""
from __future__ import annotations

import logging
import multiprocessing
import os
from collections.abc import Iterable, Iterator, Mapping

from . import sources
from .cache import Cache
from .fields import CORE_ATTRS, Rejected, Row, extra_attributes, row_from_ad, row_from_finished, row_from_literals

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


# Rejected ads named one by one in the log per import, then only counted: a history from before the marker, or
# full of forged ads, must not flood it.
REJECTIONS_NAMED = 20


class Rejections:
    """Ads not counted (fields.Rejected): the first REJECTIONS_NAMED as warnings, the rest as a count."""

    def __init__(self) -> None:
        self.named: list[str] = []
        self.count = 0

    def add(self, why: str) -> None:
        self.count += 1
        if len(self.named) < REJECTIONS_NAMED:
            self.named.append(why)

    def merge(self, other: Rejections) -> None:
        for why in other.named[:REJECTIONS_NAMED - len(self.named)]:
            self.named.append(why)
        self.count += other.count

    def log(self, source: str) -> None:
        for why in self.named:
            log.warning("%s: %s; not counted", source, why)
        if self.count > len(self.named):
            log.warning("%s: %d more ads not counted for the same kinds of reason", source,
                        self.count - len(self.named))


_matchers: dict[tuple[str, ...], sources.AttrMatcher] = {}


def parse_piece(path: str, start: int, stop: int | None, extra: list[str]
                ) -> tuple[list[tuple], int, Rejections]:
    """Cache rows of the complete ads of a history file in [start, stop), the offset after the last, and the
    ads not counted."""
    names = tuple(CORE_ATTRS + extra)
    matcher = _matchers.get(names) or _matchers.setdefault(names, sources.AttrMatcher(list(names)))
    slots, end, rows, rejected = matcher.slots, start, [], Rejections()
    for pairs, after in sources.history_ads(path, start, matcher.pattern, stop=stop):
        end = after
        r = row_from_literals(slots(pairs), "history", extra)
        if isinstance(r, Rejected):
            rejected.add(r)
        elif r is not None:
            rows.append(r)
    return rows, end, rejected


def _parse_piece(args: tuple) -> tuple[list[tuple], int, Rejections]:
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
    rejected = Rejections()
    if workers < 2 or size - offset < PARALLEL_MIN_BYTES:
        got, last[0], rejected = parse_piece(path, offset, None, extra)
        cache.add(got)
    else:
        cuts = sources.ad_boundaries(path, offset, size, PIECE_BYTES)
        pieces = [(path, a, b, extra) for a, b in zip(cuts, [*cuts[1:], None], strict=True)]
        log.info("reading %s from byte %d in %d pieces, %d processes", path, offset, len(pieces), workers)
        # fork: the workers need nothing but this module (spawn and forkserver would run the caller's main
        # module again); they never touch the cache this process has open, and this process has no threads.
        with multiprocessing.get_context("fork").Pool(workers) as pool:
            def rows() -> Iterator[tuple]:
                for got, end, bad in pool.imap(_parse_piece, pieces):   # in file order: a later ad replaces
                    last[0] = max(last[0], end)
                    rejected.merge(bad)
                    yield from got
            cache.add(rows())
    rejected.log(path)
    cache.set_mark(key, inode, last[0])
    return cache.count()


def import_ads(cache: Cache, ads: Iterable[Mapping], extra_attrs: list[str] | None = None,
               head: int = SCHEDD_HEAD, schedd: str | None = None) -> tuple[int, list[str]]:
    """Job ads as plain mappings (sources.ad_values of what htcondor2 returns, newest first) read from `schedd`
    into the cache; returns (ads read, row keys of the first `head` of them)."""
    extra = extra_attributes(extra_attrs)
    first: list[str] = []
    n = [0]
    rejected = Rejections()

    def rows() -> Iterator[Row]:
        for ad in ads:
            n[0] += 1
            r = row_from_ad(ad, "history", extra, schedd)
            if isinstance(r, Row):
                if len(first) < head:
                    first.append(r.key)
                yield r
            elif r is not None:
                rejected.add(r)

    cache.add(rows())
    rejected.log(f"schedd {schedd}" if schedd else "job ads")
    return n[0], first


def import_schedds(cache: Cache, pool: str | None = None, name: str | None = None,
                   extra_attrs: list[str] | None = None) -> int:
    """Read every schedd's (or one schedd's) history written since the last run; returns ads read.

    A schedd answers newest first, in the order jobs entered its history, and stops where `since` becomes
    true: at the newest jobs the last run read. Not at a time: a job can enter the history long after its
    EnteredCurrentStatus or CompletionDate (spooled output, leave_in_queue, a removal), and a time mark would
    stop the scan at it and lose it and every job behind it. If none of those jobs is there any more (the
    history was cleared), everything is read again; re-read jobs replace themselves (same key)."""
    attrs = CORE_ATTRS + extra_attributes(extra_attrs)
    total = 0
    for sname, schedd in sources.schedds(pool, name):
        key = f"schedd:{sname}"
        known = cache.heads(key)
        n, first = import_ads(cache, sources.schedd_history(schedd, known, attrs), extra_attrs, schedd=sname)
        total += n
        if first:
            cache.set_heads(key, first)
        log.info("read %d new history ads from schedd %s", n, sname)
    return total


def import_finished(cache: Cache, directory: str, ep: str | None = None) -> int:
    """This EP's finished-job records: larkd's exact figures, which replace the job's history row."""
    ep = ep or sources.this_ep()
    recs = sources.finished_records(directory)
    rows, rejected, old = [], Rejections(), 0
    for rec in recs:
        r = row_from_finished(rec, ep)
        if isinstance(r, Row):
            rows.append(r)
        elif r is None:
            old += 1
        else:
            rejected.add(r)
    if old:
        log.info("%d finished records carry no GlobalJobId and are left to the job history", old)
    rejected.log(directory)
    return cache.add(rows)
