"""`lark report` arguments and run: import what is new into the cache, then summarise it."""
from __future__ import annotations

import argparse
import os
import sys

from ..errors import LarkError
from . import aggregate, importer, output
from .cache import Cache

DEFAULT_CACHE = os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "lark",
                             "report.sqlite")


def add_parser(sub) -> None:
    p = sub.add_parser("report", help="network accounting from the job history: per owner, group, EP, day...",
                       description="Read new job history (every schedd of the pool by default) into a local "
                       "cache, then print figures per group.")
    src = p.add_argument_group("sources (default: every schedd of the pool)")
    src.add_argument("--pool", help="collector to ask for schedds (default: this host's pool)")
    src.add_argument("--schedd", help="only this schedd (its Name)")
    src.add_argument("--history-file", action="append", default=[], metavar="FILE",
                     help="read this history file instead of asking schedds (repeatable)")
    src.add_argument("--finished-dir", help="also count this EP's finished-job records whose history is not "
                     "written yet (default: <state_dir>/finished when it exists)")
    src.add_argument("--no-import", action="store_true", help="report from the cache as it is")
    src.add_argument("--attr", action="append", default=[], metavar="ATTR",
                     help="keep this job attribute at import so --by can use it (repeatable)")
    p.add_argument("--cache", default=DEFAULT_CACHE, help=f"SQLite cache (default {DEFAULT_CACHE})")
    p.add_argument("--by", default="Owner", help="comma list of Owner, AcctGroup, EP, NetworkType, day, week "
                   "(ISO, 2026-W45), month, or job attributes in any case (default Owner)")
    p.add_argument("--since", help="jobs completed at or after (2026-11-01, UTC)")
    p.add_argument("--until", help="jobs completed before")
    fmt = p.add_mutually_exclusive_group()
    fmt.add_argument("--csv", action="store_true")
    fmt.add_argument("--json", action="store_true")
    fmt.add_argument("--html", metavar="DIR", help="write DIR/index.html with charts")
    p.set_defaults(func=run)


def _finished_dir(args) -> str | None:
    if args.finished_dir:
        return args.finished_dir
    try:
        from ..config import load
        d = os.path.join(load(args.config).state_dir, "finished")
    except (LarkError, OSError):
        return None
    return d if os.path.isdir(d) else None


def run(args: argparse.Namespace) -> int:
    by = [b.strip() for b in args.by.split(",") if b.strip()]
    for b in by:
        aggregate.group_sql(b)   # a bad --by fails before any import
    since = aggregate.parse_when(args.since, "--since")
    until = aggregate.parse_when(args.until, "--until")
    if args.html:
        output.require_matplotlib()   # before a long import, not after it
    cache = Cache(args.cache)
    try:
        if not args.no_import:
            if args.history_file:
                for f in args.history_file:
                    importer.import_history_file(cache, f, args.attr)
            else:
                importer.import_schedds(cache, args.pool, args.schedd, args.attr)
            fin = _finished_dir(args)
            if fin:
                importer.import_finished(cache, fin)
        rep = aggregate.summarise(cache.db, by, since, until)
        if args.csv:
            output.write_csv(rep)
        elif args.json:
            output.write_json(rep)
        elif args.html:
            per_day = aggregate.per_day_by(cache.db, by[0] if by else "owner", since, until)
            print(output.write_html(rep, per_day, args.html))
        else:
            output.write_table(rep, sys.stdout)
    finally:
        cache.close()
    return 0
