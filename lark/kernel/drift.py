"""What `lark status --verify` learns about one kernel object of a running job (CNI's CHECK).

Each module that creates a per-job object has a `verify_*` function next to its `add`/`apply`, which reads the
kernel (never changes it) and returns one Finding per object it looked at: an empty `problem` when the object is
as setup made it.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Finding:
    object: str          # what was looked at, as an admin would name it: "tc htb 1:1 on lk-slot1"
    problem: str = ""    # empty: as setup made it
    fix: str = ""        # what to look for (the cause); recovering the job is the caller's to say

    @property
    def drifted(self) -> bool:
        return bool(self.problem)


def present(obj: str) -> Finding:
    return Finding(obj)


def drifted(obj: str, problem: str, fix: str) -> Finding:
    return Finding(obj, problem, fix)
