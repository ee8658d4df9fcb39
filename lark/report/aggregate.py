"""Grouping and figures, computed by SQLite over the cache (a GROUP BY over a million rows takes about a
second; loading them into Python would take longer than the whole budget)."""
from __future__ import annotations

import re
import sqlite3
from dataclasses import dataclass
from datetime import UTC, datetime

from ..errors import LarkError
from .fields import HIT_LIMIT_SHARE, extra_key

# ISO 8601 week (`2026-W53`; weeks start on Monday, week 1 holds the year's first Thursday, so the days
# around New Year belong to the week of their Thursday). SQLite before 3.46 has no %V: the week of a day is the
# week of its Thursday, counted from that Thursday's year.
_THURSDAY = "(completed + (3 - (CAST(strftime('%w', completed, 'unixepoch') AS INTEGER) + 6) % 7) * 86400)"
ISO_WEEK = (f"printf('%s-W%02d', strftime('%Y', {_THURSDAY}, 'unixepoch'), "
            f"(CAST(strftime('%j', {_THURSDAY}, 'unixepoch') AS INTEGER) - 1) / 7 + 1)")

# `--by` names -> SQL over the jobs table. Anything else is a job attribute kept at import (json in `extra`).
GROUPS = {
    "owner": "owner", "acctgroup": "acct_group", "accountinggroup": "acct_group", "group": "acct_group",
    "ep": "ep", "machine": "ep", "lastremotehost": "ep", "networktype": "network_type", "type": "network_type",
    "larknetworktype": "network_type",
    "day": "strftime('%Y-%m-%d', completed, 'unixepoch')",
    "week": ISO_WEEK,
    "month": "strftime('%Y-%m', completed, 'unixepoch')",
}
ATTR_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,99}$")

# Requested vs used: over jobs that had a limit, the bits they moved (the busier direction) against the bits
# the limit would have let through during their run.
FIGURES = f"""
    count(*) AS jobs,
    sum(bytes_in) AS bytes_in, sum(bytes_out) AS bytes_out,
    avg(avg_in_bps) AS mean_in_bps, avg(avg_out_bps) AS mean_out_bps,
    max(peak_in_bps) AS peak_in_bps, max(peak_out_bps) AS peak_out_bps,
    avg(coalesce(request_mbit, limit_mbit)) AS requested_mbit,
    avg(max(avg_in_bps, avg_out_bps)) / 1e6 AS used_mbit,
    sum(CASE WHEN limit_mbit > 0 AND wall_s > 0 THEN max(bytes_in, bytes_out) * 8.0 END)
      / sum(CASE WHEN limit_mbit > 0 AND wall_s > 0 THEN limit_mbit * 1e6 * wall_s END) AS used_of_reserved,
    sum(CASE WHEN limit_mbit > 0 AND max(peak_in_bps, peak_out_bps) >= {HIT_LIMIT_SHARE} * limit_mbit * 1e6
        THEN 1 ELSE 0 END) AS hit_limit
"""
FIGURE_NAMES = ["jobs", "bytes_in", "bytes_out", "mean_in_bps", "mean_out_bps", "peak_in_bps", "peak_out_bps",
                "requested_mbit", "used_mbit", "used_of_reserved", "hit_limit"]


@dataclass
class Report:
    by: list[str]
    rows: list[dict]
    since: int | None
    until: int | None

    def totals(self) -> dict:
        t: dict = {"jobs": 0, "bytes_in": 0, "bytes_out": 0, "hit_limit": 0}
        for r in self.rows:
            for k in t:
                t[k] += r[k] or 0
        return t


def group_sql(name: str) -> str:
    key = name.strip().lower()
    if key in GROUPS:
        return GROUPS[key]
    if not ATTR_RE.fullmatch(name.strip()):
        raise LarkError(f"cannot group by {name!r}", obj="--by",
                        fix=f"use one of {', '.join(sorted(set(GROUPS)))} or a job attribute name")
    # Kept attributes are stored under their name in lower case (fields.extra_key): `--by projectname` and
    # `--by ProjectName` are the same attribute, as in ClassAds.
    return f"json_extract(extra, '$.{extra_key(name)}')"


def parse_when(text: str | None, what: str) -> int | None:
    """`2026-11-01`, `2026-11-01T12:00`, or seconds since the epoch -> epoch seconds (UTC)."""
    if not text:
        return None
    if text.isdigit():
        return int(text)
    try:
        dt = datetime.fromisoformat(text)
    except ValueError:
        raise LarkError(f"{text!r} is not a date", obj=what, fix="write 2026-11-01 or 2026-11-01T12:00 (UTC)") from None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=UTC)
    return int(dt.timestamp())


def _window(since: int | None, until: int | None) -> tuple[str, list[int]]:
    """The WHERE clause (and its parameters) for jobs completed in [since, until)."""
    cond, params = [], []
    if since is not None:
        cond.append("completed >= ?")
        params.append(since)
    if until is not None:
        cond.append("completed < ?")
        params.append(until)
    return (f"WHERE {' AND '.join(cond)}" if cond else ""), params


def summarise(db: sqlite3.Connection, by: list[str], since: int | None = None, until: int | None = None) -> Report:
    """Figures per group over jobs that completed in [since, until)."""
    exprs = [group_sql(b) for b in by]
    where, params = _window(since, until)
    cols = ", ".join(f"{e} AS g{i}" for i, e in enumerate(exprs))
    keys = ", ".join(f"g{i}" for i in range(len(exprs)))
    group = f"GROUP BY {keys} ORDER BY bytes_in + bytes_out DESC" if exprs else ""
    sql = f"SELECT {cols + ',' if cols else ''} {FIGURES} FROM jobs {where} {group}"
    out = []
    for rec in db.execute(sql, params):
        groups = {b: ("" if v is None else v) for b, v in zip(by, rec[:len(by)], strict=True)}
        figs = dict(zip(FIGURE_NAMES, rec[len(by):], strict=True))
        if not figs["jobs"]:
            continue
        out.append({**groups, **figs})
    return Report(by=by, rows=out, since=since, until=until)


def per_day_by(db: sqlite3.Connection, by: str, since: int | None, until: int | None
               ) -> dict[str, dict[str, int]]:
    """day -> group -> bytes (in + out), for the stacked chart."""
    e = group_sql(by)
    where, params = _window(since, until)
    out: dict[str, dict[str, int]] = {}
    for day, g, b in db.execute(f"SELECT strftime('%Y-%m-%d', completed, 'unixepoch') AS d, {e} AS g, "
                                f"sum(bytes_in + bytes_out) FROM jobs {where} GROUP BY d, g ORDER BY d", params):
        out.setdefault(day, {})["" if g is None else str(g)] = b
    return out
