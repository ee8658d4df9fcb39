"""Goals a benchmark checks its figures against (issue 27: `make bench` prints each goal with met/missed).

A benchmark builds a list of `Goal`s from what it measured, prints `table(goals)` under its own table, and ends
its one key=value line with `fields(goals)` (`goals_met=<met>/<all>`, then `missed=<keys>` when any is missed).
Standard library only: the benches import it by path (bench/ is not a package).
"""
from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass
class Goal:
    key: str          # the figure's key in the benchmark's key=value line
    label: str        # what the goal says, for the table
    value: float      # what was measured (nan: not measured in this run)
    op: str           # "<=" or ">="
    limit: float
    unit: str = "ms"
    extra: str = ""   # a condition that must hold too, already checked by the caller (e.g. "0 failures")
    extra_ok: bool = True

    @property
    def met(self) -> bool:
        if math.isnan(self.value) or not self.extra_ok:
            return False
        return self.value <= self.limit if self.op == "<=" else self.value >= self.limit

    @property
    def verdict(self) -> str:
        return "not measured" if math.isnan(self.value) else ("met" if self.met else "missed")


def _num(x: float) -> str:
    return f"{x:.2f}" if abs(x) < 10 else f"{x:.1f}" if abs(x) < 1000 else f"{x:.0f}"


def table(goals: list[Goal], title: str = "issue 27 goals") -> str:
    rows = [[title, "measured", "goal", ""]]
    for g in goals:
        goal = f"{g.op} {g.limit:g} {g.unit}".rstrip() + (f", {g.extra}" if g.extra else "")
        rows.append([g.label, "-" if math.isnan(g.value) else f"{_num(g.value)} {g.unit}".rstrip(), goal,
                     g.verdict])
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    lines = []
    for r in rows:
        cells = [c.ljust(w) if i in (0, 3) else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True))]
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines)


def fields(goals: list[Goal]) -> str:
    """`goals_met=<n>/<all>` and, when some are missed, `missed=<key>,<key>`: the end of the key=value line."""
    missed = [g.key for g in goals if not g.met]
    out = f"goals_met={len(goals) - len(missed)}/{len(goals)}"
    return out + (f" missed={','.join(missed)}" if missed else "")
