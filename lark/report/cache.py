"""The local SQLite cache: one row per job, and per-source marks of what was read.

A job is counted once however many times it is read. Its key is what its schedd vouches for (fields.job_key:
schedd, ClusterId, ProcId, QDate, Owner), never the GlobalJobId its owner can edit, so one job's ad cannot
replace another's row. larkd's finished record of a job (its exact final figures, written by root on the EP)
wins over the job's history ad, which holds the last figures larkd pushed before the job left the queue: a
history row replaces another history row, fills only the kept attributes (`extra`) of an EP row, and an EP row
replaces either.
"""
from __future__ import annotations

import json
import logging
import os
import sqlite3
from collections.abc import Iterable

from ..errors import LarkError
from .fields import COLUMNS, Row, extra_json, extra_key

log = logging.getLogger(__name__)
SCHEMA_VERSION = 2

SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
    key TEXT PRIMARY KEY, gid TEXT, source TEXT NOT NULL, owner TEXT, acct_group TEXT, ep TEXT, network_type TEXT,
    completed INTEGER, wall_s REAL, bytes_in INTEGER, bytes_out INTEGER, packets_in INTEGER, packets_out INTEGER,
    avg_in_bps REAL, avg_out_bps REAL, peak_in_bps REAL, peak_out_bps REAL, limit_mbit REAL, request_mbit REAL,
    extra TEXT);
CREATE INDEX IF NOT EXISTS jobs_completed ON jobs(completed);
CREATE TABLE IF NOT EXISTS marks (source TEXT PRIMARY KEY, a INTEGER, b INTEGER);
CREATE TABLE IF NOT EXISTS heads (source TEXT NOT NULL, key TEXT NOT NULL);
"""
_INSERT = f"INSERT INTO jobs ({', '.join(COLUMNS)}) VALUES ({', '.join('?' * len(COLUMNS))})"
_SOURCE = COLUMNS.index("source")
_FIGURES = [c for c in COLUMNS[1:] if c not in ("ep", "extra")]
# History replaces history; over larkd's record it only adds the kept attributes and the schedd's name for the
# EP (LastRemoteHost, what every other row of that EP says; larkd's record has the EP's own host name).
_UPSERT_HISTORY = _INSERT + " ON CONFLICT(key) DO UPDATE SET " + ", ".join(
    f"{c} = CASE WHEN jobs.source = 'ep' THEN jobs.{c} ELSE excluded.{c} END" for c in _FIGURES
) + ", ep = coalesce(nullif(excluded.ep, ''), jobs.ep), extra = coalesce(excluded.extra, jobs.extra)"
# larkd's record replaces whatever was there, keeping the history's kept attributes (it has none) and EP name.
_UPSERT_EP = _INSERT + " ON CONFLICT(key) DO UPDATE SET " + ", ".join(
    f"{c} = excluded.{c}" for c in _FIGURES) + (
    ", ep = CASE WHEN jobs.source = 'ep' THEN excluded.ep ELSE coalesce(nullif(jobs.ep, ''), excluded.ep) END"
    ", extra = coalesce(jobs.extra, excluded.extra)")

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
        version = self.db.execute("PRAGMA user_version").fetchone()[0]
        if version >= SCHEMA_VERSION:
            return
        if "key" not in {c[1] for c in self.db.execute("PRAGMA table_info(jobs)")}:
            self._key_jobs()
        with self.db:
            if version < 1:
                self._lower_case_extra()
            self.db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")

    def _key_jobs(self) -> None:
        """Version 2 keys a job by fields.job_key, not by GlobalJobId (its owner can edit it). A cache written
        before holds GlobalJobId `schedd#cluster.proc#qdate`, which with the owner is the same key for an honest
        ad. Its rows were imported before the marker and value checks and are kept as they are."""
        self.db.executescript(f"""
            BEGIN;
            ALTER TABLE jobs RENAME TO jobs_v1;
            DROP INDEX IF EXISTS jobs_completed;
            ALTER TABLE heads RENAME TO heads_v1;
            {SCHEMA}
            INSERT OR REPLACE INTO jobs ({', '.join(COLUMNS)})
                SELECT gid || '#' || coalesce(owner, ''), {', '.join(COLUMNS[1:])} FROM jobs_v1;
            INSERT INTO heads (source, key) SELECT source, gid FROM heads_v1;
            DROP TABLE jobs_v1;
            DROP TABLE heads_v1;
            COMMIT;""")
        n = self.count()
        if n:
            log.warning("report cache %s: %d jobs imported before history ads had to carry LarkFiguresBy are kept; "
                        "delete the cache to count only the ads larkd marked", self.path, n)

    def _lower_case_extra(self) -> None:
        """Version 1 stores kept attributes under their lower-case name (fields.extra_key); a cache written
        before keeps the ad's spelling, which `--by` in another case would not find."""
        old = self.db.execute("SELECT rowid, extra FROM jobs WHERE extra IS NOT NULL").fetchall()
        self.db.executemany("UPDATE jobs SET extra = ? WHERE rowid = ?", [
            (extra_json(sorted({extra_key(k): v for k, v in json.loads(e).items() if v is not None}.items())),
             rowid) for rowid, e in old])
        if old:
            log.info("report cache %s: %d jobs' kept attributes stored under lower-case names", self.path, len(old))

    def close(self) -> None:
        self.db.close()

    def add(self, rows: Iterable[Row | tuple], batch: int = 20000) -> int:
        """Store rows (larkd's records win over history rows, module docstring); returns how many were offered."""
        n = 0
        hist: list[tuple] = []
        ep: list[tuple] = []
        with self.db:
            for r in rows:
                (ep if r[_SOURCE] == "ep" else hist).append(r)
                n += 1
                if len(hist) >= batch:
                    self.db.executemany(_UPSERT_HISTORY, hist)
                    hist.clear()
                if len(ep) >= batch:
                    self.db.executemany(_UPSERT_EP, ep)
                    ep.clear()
            if hist:
                self.db.executemany(_UPSERT_HISTORY, hist)
            if ep:
                self.db.executemany(_UPSERT_EP, ep)
        return n

    def mark(self, source: str) -> tuple[int, int] | None:
        got = self.db.execute("SELECT a, b FROM marks WHERE source = ?", (source,)).fetchone()
        return (got[0], got[1]) if got else None

    def set_mark(self, source: str, a: int, b: int) -> None:
        with self.db:
            self.db.execute("INSERT INTO marks (source, a, b) VALUES (?, ?, ?) ON CONFLICT(source) DO UPDATE SET "
                            "a = excluded.a, b = excluded.b", (source, a, b))

    def heads(self, source: str) -> list[str]:
        """The keys of the newest jobs the last run read from a schedd (where the next scan stops)."""
        return [k for k, in self.db.execute("SELECT key FROM heads WHERE source = ? ORDER BY rowid", (source,))]

    def set_heads(self, source: str, keys: list[str]) -> None:
        with self.db:
            self.db.execute("DELETE FROM heads WHERE source = ?", (source,))
            self.db.executemany("INSERT INTO heads (source, key) VALUES (?, ?)", [(source, k) for k in keys])

    def count(self) -> int:
        return self.db.execute("SELECT count(*) FROM jobs").fetchone()[0]
