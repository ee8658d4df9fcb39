"""The local SQLite cache: one row per job keyed by GlobalJobId, and per-source marks of what was read.

A job is counted once however many times it is read: history rows replace each other and any EP record of
the same job (history is the source of truth), and an EP record never replaces a history row.
"""
from __future__ import annotations

import json
import logging
import os
import sqlite3
from typing import Iterable

from ..errors import LarkError
from .fields import COLUMNS, Row, extra_json, extra_key

log = logging.getLogger(__name__)
SCHEMA_VERSION = 1

SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
    gid TEXT PRIMARY KEY, source TEXT NOT NULL, owner TEXT, acct_group TEXT, ep TEXT, network_type TEXT,
    completed INTEGER, wall_s REAL, bytes_in INTEGER, bytes_out INTEGER, packets_in INTEGER, packets_out INTEGER,
    avg_in_bps REAL, avg_out_bps REAL, peak_in_bps REAL, peak_out_bps REAL, limit_mbit REAL, request_mbit REAL,
    extra TEXT);
CREATE INDEX IF NOT EXISTS jobs_completed ON jobs(completed);
CREATE TABLE IF NOT EXISTS marks (source TEXT PRIMARY KEY, a INTEGER, b INTEGER);
CREATE TABLE IF NOT EXISTS heads (source TEXT NOT NULL, gid TEXT NOT NULL);
"""
_INSERT = f"INSERT INTO jobs ({', '.join(COLUMNS)}) VALUES ({', '.join('?' * len(COLUMNS))})"
# History replaces whatever was there; an EP record fills in only until the job's history arrives.
_UPSERT_HISTORY = _INSERT + " ON CONFLICT(gid) DO UPDATE SET " + ", ".join(
    f"{c} = excluded.{c}" for c in COLUMNS[1:])
_INSERT_EP = _INSERT + " ON CONFLICT(gid) DO NOTHING"


class Cache:
    def __init__(self, path: str):
        self.path = path
        d = os.path.dirname(os.path.abspath(path))
        try:
            os.makedirs(d, exist_ok=True)
            self.db = sqlite3.connect(path)
            self.db.executescript(SCHEMA)
        except (OSError, sqlite3.Error) as e:
            raise LarkError(f"cannot open the report cache: {e}", obj=path,
                            fix="give --cache a writable path (default ~/.cache/lark/report.sqlite)") from None
        # The cache can be rebuilt from history at any time: trade durability for import speed.
        self.db.execute("PRAGMA journal_mode = WAL")
        self.db.execute("PRAGMA synchronous = OFF")
        self.db.execute("PRAGMA cache_size = -65536")   # 64 MiB: the key index of a million jobs stays in memory
        self._upgrade()

    def _upgrade(self) -> None:
        """Version 1 stores kept attributes under their lower-case name (fields.extra_key); a cache written
        before keeps the ad's spelling, which `--by` in another case would not find."""
        if self.db.execute("PRAGMA user_version").fetchone()[0] >= SCHEMA_VERSION:
            return
        with self.db:
            old = self.db.execute("SELECT gid, extra FROM jobs WHERE extra IS NOT NULL").fetchall()
            self.db.executemany("UPDATE jobs SET extra = ? WHERE gid = ?", [
                (extra_json(sorted({extra_key(k): v for k, v in json.loads(e).items() if v is not None}.items())),
                 gid) for gid, e in old])
            self.db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
        if old:
            log.info("report cache %s: %d jobs' kept attributes stored under lower-case names", self.path, len(old))

    def close(self) -> None:
        self.db.close()

    def add(self, rows: Iterable[Row | tuple], batch: int = 20000) -> int:
        """Store rows (history rows upsert; EP rows only fill gaps); returns how many were offered."""
        n = 0
        hist: list[tuple] = []
        ep: list[tuple] = []
        with self.db:
            for r in rows:
                (ep if r[1] == "ep" else hist).append(r)
                n += 1
                if len(hist) >= batch:
                    self.db.executemany(_UPSERT_HISTORY, hist)
                    hist.clear()
                if len(ep) >= batch:
                    self.db.executemany(_INSERT_EP, ep)
                    ep.clear()
            if hist:
                self.db.executemany(_UPSERT_HISTORY, hist)
            if ep:
                self.db.executemany(_INSERT_EP, ep)
        return n

    def mark(self, source: str) -> tuple[int, int] | None:
        got = self.db.execute("SELECT a, b FROM marks WHERE source = ?", (source,)).fetchone()
        return (got[0], got[1]) if got else None

    def set_mark(self, source: str, a: int, b: int) -> None:
        with self.db:
            self.db.execute("INSERT INTO marks (source, a, b) VALUES (?, ?, ?) ON CONFLICT(source) DO UPDATE SET "
                            "a = excluded.a, b = excluded.b", (source, a, b))

    def heads(self, source: str) -> list[str]:
        """The newest jobs the last run read from a schedd (where the next scan stops)."""
        return [g for g, in self.db.execute("SELECT gid FROM heads WHERE source = ? ORDER BY rowid", (source,))]

    def set_heads(self, source: str, gids: list[str]) -> None:
        with self.db:
            self.db.execute("DELETE FROM heads WHERE source = ?", (source,))
            self.db.executemany("INSERT INTO heads (source, gid) VALUES (?, ?)", [(source, g) for g in gids])

    def count(self) -> int:
        return self.db.execute("SELECT count(*) FROM jobs").fetchone()[0]
