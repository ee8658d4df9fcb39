"""A report as a terminal table (rich), CSV, JSON, or a self-contained HTML page with PNG charts."""
from __future__ import annotations

import base64
import csv
import html
import io
import json
import os
import sys
from datetime import UTC, datetime
from typing import TextIO

from ..errors import LarkError
from .aggregate import FIGURE_NAMES, Report

HEADINGS = {"jobs": "jobs", "bytes_in": "bytes in", "bytes_out": "bytes out", "mean_in_bps": "mean in",
            "mean_out_bps": "mean out", "peak_in_bps": "peak in", "peak_out_bps": "peak out",
            "requested_mbit": "requested", "used_mbit": "used", "used_of_reserved": "used/reserved",
            "hit_limit": "hit limit"}


def human_bytes(n: float | None) -> str:
    n = float(n or 0)
    for unit in ("B", "kB", "MB", "GB", "TB", "PB"):
        if abs(n) < 1000 or unit == "PB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1000
    return ""


def human_rate(bps: float | None) -> str:
    bps = float(bps or 0)
    for unit, div in (("Gbit/s", 1e9), ("Mbit/s", 1e6), ("kbit/s", 1e3)):
        if bps >= div:
            return f"{bps / div:.1f} {unit}"
    return f"{bps:.0f} bit/s"


def _cell(name: str, v) -> str:
    if name in ("bytes_in", "bytes_out"):
        return human_bytes(v)
    if name.endswith("_bps"):
        return human_rate(v)
    if name in ("requested_mbit", "used_mbit"):
        return "-" if v is None else f"{v:.1f} Mbit/s"
    if name == "used_of_reserved":
        return "-" if v is None else f"{v * 100:.1f}%"
    return str(v if v is not None else "-")


def _period(rep: Report) -> str:
    def fmt(t: int) -> str:
        return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%d %H:%M UTC")
    return f"{fmt(rep.since) if rep.since else 'the beginning'} to {fmt(rep.until) if rep.until else 'now'}"


def write_table(rep: Report, out: TextIO | None = None) -> None:
    out = out or sys.stdout
    from rich.console import Console
    from rich.table import Table
    t = Table(title=f"Lark network accounting, {_period(rep)}")
    for b in rep.by:
        t.add_column(b)
    for f in FIGURE_NAMES:
        t.add_column(HEADINGS[f], justify="right")
    for r in rep.rows:
        t.add_row(*[str(r[b]) for b in rep.by], *[_cell(f, r[f]) for f in FIGURE_NAMES])
    tot = rep.totals()
    if rep.by and rep.rows:
        t.add_section()
        t.add_row("total", *[""] * (len(rep.by) - 1), str(tot["jobs"]), human_bytes(tot["bytes_in"]),
                  human_bytes(tot["bytes_out"]), *[""] * 7, str(tot["hit_limit"]))
    Console(file=out, width=max(120, 14 * (len(rep.by) + len(FIGURE_NAMES)))).print(t)


def write_csv(rep: Report, out: TextIO | None = None) -> None:
    out = out or sys.stdout
    w = csv.writer(out)
    w.writerow(rep.by + FIGURE_NAMES)
    for r in rep.rows:
        w.writerow([r[b] for b in rep.by] + [r[f] for f in FIGURE_NAMES])


def to_json(rep: Report) -> dict:
    return {"by": rep.by, "since": rep.since, "until": rep.until, "groups": rep.rows, "totals": rep.totals()}


def write_json(rep: Report, out: TextIO | None = None) -> None:
    out = out or sys.stdout
    json.dump(to_json(rep), out, indent=2, sort_keys=True)
    out.write("\n")


def _png(fig) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100, bbox_inches="tight")
    return base64.b64encode(buf.getvalue()).decode()


def require_matplotlib() -> None:
    """The charts of --html need matplotlib, an optional dependency: say how to get it."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise LarkError("the HTML report's charts need matplotlib, which is not installed", obj="--html",
                        fix="pip install 'htcondor-lark[report]' into Lark's environment, or use --csv/--json"
                        ) from None


def charts(rep: Report, per_day: dict[str, dict[str, int]], top: int = 10) -> dict[str, str]:
    """Base64 PNGs: bytes per group per day (stacked), top groups by bytes, requested vs used."""
    require_matplotlib()
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    out = {}
    label = rep.by[0] if rep.by else "all"
    days = sorted(per_day)
    totals: dict[str, int] = {}
    for d in days:
        for g, b in per_day[d].items():
            totals[g] = totals.get(g, 0) + b
    groups = sorted(totals, key=lambda g: totals[g], reverse=True)
    shown, rest = groups[:top], groups[top:]
    fig, ax = plt.subplots(figsize=(9, 4.5))
    bottom = [0.0] * len(days)
    for g in shown + (["(others)"] if rest else []):
        vals = [sum(per_day[d].get(x, 0) for x in rest) / 1e9 if g == "(others)" else per_day[d].get(g, 0) / 1e9
                for d in days]
        ax.bar(days, vals, bottom=bottom, label=g or "(none)")
        bottom = [a + b for a, b in zip(bottom, vals, strict=True)]
    ax.set_ylabel("GB (in + out)")
    ax.set_title(f"Bytes per {label} per day")
    if days:
        ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1, 1))
    ax.tick_params(axis="x", rotation=45)
    out["per_day"] = _png(fig)
    plt.close(fig)

    ranked = sorted(rep.rows, key=lambda r: (r["bytes_in"] or 0) + (r["bytes_out"] or 0), reverse=True)[:top]
    names = [" / ".join(str(r[b]) or "(none)" for b in rep.by) or "all" for r in ranked][::-1]
    fig, ax = plt.subplots(figsize=(9, 0.45 * len(names) + 1.5))
    ax.barh(names, [(r["bytes_in"] or 0) / 1e9 for r in ranked][::-1], label="in")
    ax.barh(names, [(r["bytes_out"] or 0) / 1e9 for r in ranked][::-1],
            left=[(r["bytes_in"] or 0) / 1e9 for r in ranked][::-1], label="out")
    ax.set_xlabel("GB")
    ax.set_title(f"Top {len(names)} by bytes moved")
    ax.legend()
    out["top"] = _png(fig)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(9, 0.45 * len(names) + 1.5))
    req = [ranked[i]["requested_mbit"] or 0 for i in range(len(ranked))][::-1]
    used = [ranked[i]["used_mbit"] or 0 for i in range(len(ranked))][::-1]
    y = list(range(len(names)))
    ax.barh([v + 0.2 for v in y], req, height=0.4, label="requested (mean Mbit/s)")
    ax.barh([v - 0.2 for v in y], used, height=0.4, label="used (mean Mbit/s)")
    ax.set_yticks(y, names)
    ax.set_title("Requested vs used bandwidth")
    ax.legend()
    out["requested_vs_used"] = _png(fig)
    plt.close(fig)
    return out


def write_html(rep: Report, per_day: dict[str, dict[str, int]], directory: str) -> str:
    """index.html with the charts inlined (one file to mail or publish) plus the PNGs beside it."""
    os.makedirs(directory, exist_ok=True)
    pngs = charts(rep, per_day)
    for name, data in pngs.items():
        with open(os.path.join(directory, f"{name}.png"), "wb") as f:
            f.write(base64.b64decode(data))
    e = html.escape
    head = "".join(f"<th>{e(b)}</th>" for b in rep.by) + "".join(f"<th>{e(HEADINGS[f])}</th>" for f in FIGURE_NAMES)
    body = "".join("<tr>" + "".join(f"<td>{e(str(r[b]))}</td>" for b in rep.by)
                   + "".join(f"<td class=n>{e(_cell(f, r[f]))}</td>" for f in FIGURE_NAMES) + "</tr>"
                   for r in rep.rows)
    imgs = "".join(f'<figure><img alt="{e(n)}" src="data:image/png;base64,{d}"></figure>' for n, d in pngs.items())
    page = f"""<!doctype html><html><head><meta charset="utf-8"><title>Lark network accounting</title>
<style>body{{font-family:sans-serif;margin:2em}}table{{border-collapse:collapse}}td,th{{border:1px solid #ccc;
padding:3px 8px}}td.n{{text-align:right}}img{{max-width:100%}}</style></head><body>
<h1>Lark network accounting</h1><p>Jobs completed {e(_period(rep))}, grouped by {e(', '.join(rep.by) or 'nothing')}.
Generated {e(datetime.now(UTC).strftime('%Y-%m-%d %H:%M UTC'))}.</p>
{imgs}<table><tr>{head}</tr>{body}</table></body></html>
"""
    path = os.path.join(directory, "index.html")
    with open(path, "w") as page_file:
        page_file.write(page)
    return path
