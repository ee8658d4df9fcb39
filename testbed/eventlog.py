"""How often each job started, from its HTCondor job event log (the submit file's `log = ...`).

Demos, benchmarks and pool probes submit jobs with file transfer, as real pools do; a job that the pool evicts and
starts again can still end with exit code 0 and good-looking output (HTCondor 24.x/25.x evicted every file-transfer
job forever while a JOB_EXIT hook was configured). So each of them counts the starts in the event log, and a job
that started more than once or was evicted fails the run (tests/e2e/condor.py does the same with HTCondor's
reader).

Standard library only, like testbed.py and pool.py (they run under any python3, without HTCondor's Python
bindings): the text format is read by event number instead of with htcondor2.JobEventLog. An event's first line
is `NNN (cluster.proc.subproc) date time text`, its body lines follow, and a line `...` ends it. The numbers used:
001 execute, 004 evicted, 007 shadow exception, 022 disconnected, 024 reconnect failed.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

EXECUTE = "001"
# Events that mean a start nobody asked for: the job was evicted, or lost its shadow or its starter.
UNASKED = {"004": "evicted", "007": "shadow exception", "022": "disconnected", "024": "reconnect failed"}
_HEADER = re.compile(r"^(\d{3}) \((\d+)\.(\d+)\.\d+\) (.*)$")
_HOST = re.compile(r"<(\d+\.\d+\.\d+\.\d+):")
_SCRATCH = re.compile(r'^\s*CondorScratchDir = "(.*)"\s*$')


@dataclass
class Event:
    code: str                 # "001", "004", ...
    job: str                  # "cluster.proc"
    text: str                 # the rest of the first line: date, time, what happened
    body: list[str] = field(default_factory=list)


def parse(text: str) -> list[Event]:
    """The events of a text event log, in order. A half-written last event (no `...` yet) is left out."""
    events: list[Event] = []
    current: Event | None = None
    expect_header = True
    for line in text.splitlines():
        if line == "...":
            if current is not None:
                events.append(current)
            current, expect_header = None, True
            continue
        if expect_header:
            expect_header = False
            m = _HEADER.match(line)
            if m is None:
                raise ValueError(f"not a text job event log (XML or JSON format?): {line[:80]!r}")
            current = Event(m.group(1), f"{int(m.group(2))}.{int(m.group(3))}", m.group(4))
        elif current is not None:
            current.body.append(line)
    return events


def read(path: Path) -> list[Event]:
    """The events of the log at `path`; none if it does not exist (yet)."""
    try:
        return parse(Path(path).read_text(errors="replace"))
    except FileNotFoundError:
        return []


def starts(path: Path) -> dict[str, list[str]]:
    """Job id ("cluster.proc") -> what its event log says happened to it, in order: "execute" for each start and
    "evicted", "shadow exception", "disconnected", "reconnect failed" for each unasked-for end."""
    seen: dict[str, list[str]] = {}
    for e in read(path):
        if e.code == EXECUTE:
            seen.setdefault(e.job, []).append("execute")
        elif e.code in UNASKED:
            seen.setdefault(e.job, []).append(UNASKED[e.code])
    return seen


def not_once(path: Path, jobs: list[str]) -> dict[str, list[str]]:
    """Those of `jobs` whose log does not show exactly one start and nothing else (no start at all counts too)."""
    seen = starts(path)
    return {job: seen.get(job, []) for job in jobs if seen.get(job, []) != ["execute"]}


def describe(job: str, events: list[str]) -> str:
    """One line for a job that did not start exactly once."""
    n = events.count("execute")
    if not events:
        return f"job {job}: its event log shows no start"
    return f"job {job}: started {n} time{'s' if n != 1 else ''}; its event log shows {', '.join(events)}"


@dataclass
class Execute:
    host: str                 # the execution point's address, from the startd's contact string
    scratch: str | None       # the job's scratch directory on that machine (CondorScratchDir)


def last_execute(path: Path, job: str) -> Execute | None:
    """Where the job's latest start is: the execute event's host address and scratch directory; None before it
    started."""
    found = None
    for e in read(path):
        if e.code == EXECUTE and e.job == job:
            host = _HOST.search(e.text)
            scratch = next((m.group(1) for line in e.body if (m := _SCRATCH.match(line))), None)
            found = Execute(host.group(1) if host else "", scratch)
    return found
