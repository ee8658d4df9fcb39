"""One slot's job as larkd's server keeps it in memory (issue 24, "a Job"): the slot's lock, the starter's pidfd
watch, its ssh sessions' namespace, the PREPARE_JOB check, the push state and the exit barrier served.

What lives on disk stays where it is: the record (records.py), the pin with the carried figures (pins.py), the
finished records. This object is only what used to be seven slot-keyed dicts on `Larkd`; `SlotJobs.end` drops a
job's share of it in one place when its final release comes, so a new piece of per-job state is one field here and
cannot be forgotten there.
"""
from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Check:
    """PREPARE_JOB's decision for one starter, reused once by its setup if recent (`Larkd.checked_plan`)."""
    starter_pid: int
    starter_start: int
    at: float          # time.monotonic() when decided
    plan: dict         # NetworkPlan.to_dict()


@dataclass(frozen=True)
class Pushed:
    """The periodic push state: the job pushed, the time of its last push, how many went out."""
    job_id: str
    at: float
    pushes: int


@dataclass(frozen=True)
class PushRequest:
    """The last push a job asked for itself (its own `push`, a second barrier, an upload): its budget."""
    job_id: str
    at: float


@dataclass
class SlotJob:
    """The in-memory state of the job on slot `key` (the slot's key, names.job_key)."""
    key: str
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)  # the slot's: outlives the job (SlotJobs.end)
    watch: int | None = None            # pidfd of the job's starter, read by the event loop
    session_netns: int | None = None    # netns inode of the job, once it had an ssh session (leftovers die at its end)
    check: Check | None = None          # PREPARE_JOB's decision, until its setup takes it
    pushed: Pushed | None = None        # the periodic push state (push thread and exit barrier)
    push_request: PushRequest | None = None   # the job's own push budget
    barrier: str | None = None          # the job whose exit barrier was served (once per job)

    def stop_watch(self, loop: asyncio.AbstractEventLoop) -> None:
        """Stop watching the starter's pidfd and close it, if watched."""
        fd, self.watch = self.watch, None
        if fd is not None:
            loop.remove_reader(fd)
            os.close(fd)


class SlotJobs:
    """larkd's slot key -> SlotJob, an entry created on first use. Only the event loop creates or ends entries;
    the push thread reads and sets push state on the entry it got."""

    def __init__(self) -> None:
        self._jobs: dict[str, SlotJob] = {}

    def get(self, key: str) -> SlotJob:
        """The slot's job, created (with the slot's lock) on first use."""
        job = self._jobs.get(key)
        if job is None:
            job = self._jobs.setdefault(key, SlotJob(key))
        return job

    def peek(self, key: str) -> SlotJob | None:
        """The slot's job if there is one, without creating it."""
        return self._jobs.get(key)

    def __iter__(self) -> Iterator[SlotJob]:
        return iter(list(self._jobs.values()))

    def __len__(self) -> int:
        return len(self._jobs)

    def end(self, key: str, loop: asyncio.AbstractEventLoop,
            starter: tuple[int, int] | None = None) -> SlotJob | None:
        """The final release of the slot's job (its lock held): stop watching its starter and drop the job's
        state; the ended object is returned for what it still names (its ssh sessions' namespace). The slot keeps
        its lock (a request waiting on it must still exclude the next ones) in a fresh entry, and a PREPARE_JOB
        check not made for `starter` (the ended job's, from its pin): the slot's next job's."""
        job = self._jobs.get(key)
        if job is None:
            return None
        fresh = SlotJob(key, lock=job.lock)
        if job.check is not None and (starter is None or (job.check.starter_pid, job.check.starter_start) != starter):
            fresh.check = job.check
        self._jobs[key] = fresh   # one assignment: a reader gets the ended job or the fresh one, never none
        job.stop_watch(loop)
        return job
