"""Job records: one JSON file per job, replaced atomically; in memory, one live object per job.

Records live in run_dir (tmpfs) because they describe kernel objects that do not survive a reboot either;
an atomic rename is enough to survive the daemon being killed at any point. Finished-job accounting goes to
state_dir, which does persist.

When the file is written: the record is saved before a job's first kernel object exists (jobnet.setup) and after
every setup step that changed it, but while the job is still setting up a save writes the file only when it changed
something a restart after a crash reads from it (`crash_view`); the "ready" save and every later one write the
whole record. After a crash mid-setup larkd's restart adopts only ready records and tears everything else down
(reconcile, sweep, `lark gc`), working from the job's key: the addresses and the inbound port are locks named by
the key, the limits go with the veth, the DNS revocation with the job. What that teardown does read from a record
is the job's identity, its network type (which mode to detach from) and its DHCP lease (to release it at the
server): a step that changes those is written at once. A NAT job's setup thus writes its record twice (before the
first kernel object, and "ready"), not after every step.
"""
from __future__ import annotations

import contextlib
import json
import logging
import os
import time
from dataclasses import dataclass, field, fields
from typing import Any, NoReturn

from ..statefiles import STATE_JSON, LiveFiles, atomic_write, private_dir, read_own

log = logging.getLogger(__name__)


class FrozenPlan(dict):
    """A record's plan, read-only: any write raises. A dict underneath, so the record's file and the wire answers
    serialise it as before (json writes a dict subclass as a dict); `dict(plan)` is a writable copy."""

    def _frozen(self, *args: Any, **kwargs: Any) -> NoReturn:
        raise TypeError("a job record's plan is what was decided and built at setup, and is read-only: write the "
                        "changing state to the record's own fields (JobRecord.renewed_lease, .rebalanced_mbit)")

    __setitem__ = __delitem__ = __ior__ = _frozen
    clear = pop = popitem = setdefault = update = _frozen

    def __reduce__(self) -> tuple:
        return (FrozenPlan, (dict(self),))

    def __copy__(self) -> FrozenPlan:
        return self


@dataclass
class JobRecord:
    key: str
    slot: str
    job_id: str
    starter_pid: int
    starter_start: int                # /proc/<pid>/stat starttime, so a reused pid is not mistaken for ours
    job_pid: int
    netns_inode: int
    netns: str
    host_if: str
    # JobNetwork.to_dict(): the decided plan and the addresses built for it. Setup replaces it step by step; it
    # is never changed in place (a FrozenPlan). What changes while the job runs is in the two fields below.
    plan: dict
    phase: str = "setting-up"         # setting-up -> ready -> tearing-down (kept there when teardown failed)
    shaped: bool = False              # its limit is on the link (a fair-share job counts from then on)
    created: float = field(default_factory=time.time)
    # State, not plan: None until it first changes after setup (and in a record of a larkd before these fields,
    # whose plan held the changed values), so the plan's value is then the current one. Read `lease` and
    # `rate_limit_mbit`.
    renewed_lease: dict | None = None      # the DHCP lease as last renewed (jobnet.renew_leases)
    rebalanced_mbit: float | None = None   # a fair-share job's limit as last rebalanced (jobnet.fair_rebalance)

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "plan" and not isinstance(value, FrozenPlan):
            value = FrozenPlan(value)
        object.__setattr__(self, name, value)

    @property
    def lease(self) -> dict | None:
        """The job's current DHCP lease (None: not a DHCP job)."""
        return self.renewed_lease if self.renewed_lease is not None else self.plan.get("dhcp")

    @property
    def rate_limit_mbit(self) -> float | None:
        """The job's current rate limit, each direction (None: unlimited)."""
        return self.rebalanced_mbit if self.rebalanced_mbit is not None else self.plan.get("rate_limit_mbit")

    def current_plan(self) -> dict:
        """The plan with the current lease and limit: what `lark status`, the job's ad and verify read."""
        d = dict(self.plan)
        if self.renewed_lease is not None:
            d["dhcp"] = self.renewed_lease
        if self.rebalanced_mbit is not None:
            d["rate_limit_mbit"] = self.rebalanced_mbit
        return d


_RECORD_FIELDS = frozenset(f.name for f in fields(JobRecord))
# Plan fields a teardown after a crash mid-setup finds from the job's key (address and port locks named by it) or
# does not need (what the job was told, limits that go with its veth): changing only these does not write a
# record that is still setting up. Any other field (the DHCP lease, the network type, one added later) does.
# The record's own field rebalanced_mbit is of the same kind (a limit goes with the veth); renewed_lease is not
# (teardown releases the current lease at the server), but only a ready job's lease is renewed.
NOT_READ_AFTER_CRASH = frozenset({"plan", "shaped", "rebalanced_mbit"})
FOUND_BY_KEY = frozenset({"ipv4", "ipv4_prefix", "gateway4", "ipv6", "ipv6_prefix", "gateway6", "inbound_port",
                          "dns_revoked_by", "rate_limit_mbit"})


def crash_view(rec: JobRecord) -> str | None:
    """What a restart reads from the record of a job still setting up, as text; None once it is ready or being torn
    down (every save then writes: "ready" is what a restart adopts, "tearing-down" what it must not)."""
    if rec.phase != "setting-up":
        return None
    d = {k: v for k, v in vars(rec).items() if k not in NOT_READ_AFTER_CRASH}
    d["plan"] = {k: v for k, v in rec.plan.items() if k not in FOUND_BY_KEY}
    return STATE_JSON.encode(d)


class RecordStore(LiveFiles):
    """The records of one larkd, each read from disk once and then shared.

    Every thread that changes a job's record changes the same live object, so a save can never put back what
    another thread changed in between: a fair-share rebalance setting another job's limit while that job's own
    setup marks it ready wrote two copies before, and the later save lost the other's change.
    """

    def save(self, rec: JobRecord) -> bool:
        """The record as the key's live one, its file written unless it is setting up and changed nothing a crash
        needs (`crash_view`); True when written. A new job's record replaces the one of the job before it."""
        return self._store(rec.key, rec)

    def _crash_view(self, obj: JobRecord) -> str | None:
        return crash_view(obj)

    def load(self, key: str) -> JobRecord | None:
        with self._lock:
            rec = self._live.get(key)
            if rec is None:
                rec = self._read(key)
                if rec is not None:
                    self._live[key] = rec
            return rec

    def _read(self, key: str) -> JobRecord | None:
        try:
            data = json.loads(read_own(self.path(key)))
            # Fields a former version wrote and this one no longer has (steps, error, counters) are dropped,
            # so an upgrade adopts running jobs instead of treating their records as unreadable.
            return JobRecord(**{k: v for k, v in data.items() if k in _RECORD_FIELDS})
        except FileNotFoundError:
            return None
        except (ValueError, TypeError, AttributeError, OSError) as e:
            log.error("record %s is unreadable (%s); it will be treated as an orphan", self.path(key), e)
            return None

    def delete(self, key: str) -> None:
        self._forget(key)

    def all(self) -> list[JobRecord]:
        return [r for r in (self.load(k) for k in self.keys()) if r is not None]


class FinishedStore:
    """Final accounting of finished jobs, one JSON file per job, pruned to the newest `keep`."""

    def __init__(self, directory: str, keep: int = 10000):
        self.dir = directory
        self.keep = keep
        # Who moved how much, when, from which address: for root (`lark report`) only.
        private_dir(self.dir)
        # Files in the directory as of the last listing plus those saved since (None: not listed yet). The writers
        # (larkd, and `lark gc` only while it holds larkd's lock) each count their own, so the directory is listed
        # only when the count passes `keep` by 1%, not at every job's end: listing and sorting 10000 names took
        # ~13 ms, and a full directory (the steady state) would be listed at every save. It then holds up to
        # keep + keep // 100 records between prunes (exactly `keep` below 100).
        self._count: int | None = None

    def finish(self, key: str, usage: dict, reason: str, rec: JobRecord | None = None, *, job_id: str = "",
               started: float | None = None) -> dict:
        """The one writer of a job's finished record: its figures (`usage`, carried ones added in), why it ended,
        and who it was: from its record (`rec`) when it ended with a network, else (its network released earlier,
        its figures carried by its pin) the pin's `job_id` and `started`. Returns the summary it saved."""
        summary = dict(usage, key=key, ended=time.time(), reason=reason)
        if rec is None:
            summary.update(job_id=job_id, started=started)
        else:
            plan = rec.plan
            summary.update({"job_id": rec.job_id, "slot": rec.slot, "started": rec.created,
                            "rate_limit_mbit": rec.rate_limit_mbit,   # the limit it ended under
                            **{k: plan.get(k) for k in ("network_type", "ipv4", "owner", "accounting_group",
                                                        "global_job_id", "request_bandwidth_mbit")}})
        self.save(key, summary)
        return summary

    def save(self, key: str, summary: dict) -> str:
        name = f"{int(summary.get('ended', time.time()) * 1000)}-{key}.json"
        atomic_write(os.path.join(self.dir, name), STATE_JSON.encode(summary))
        if self._count is not None:
            self._count += 1
        if self._count is None or self._count > self.keep + self.keep // 100:  # a lowered keep: at the next save
            self._prune()
        return name

    def _prune(self) -> None:
        names = sorted(n for n in os.listdir(self.dir) if n.endswith(".json"))
        excess = max(0, len(names) - self.keep)
        for n in names[:excess]:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(self.dir, n))
        self._count = len(names) - excess

    def all(self) -> list[dict]:
        out = []
        for n in sorted(os.listdir(self.dir)):
            if n.endswith(".json"):
                try:
                    out.append(json.loads(read_own(os.path.join(self.dir, n))))
                except (OSError, ValueError):
                    continue
        return out

    def latest_for_key(self, key: str) -> dict | None:
        names = sorted(n for n in os.listdir(self.dir) if n.endswith(f"-{key}.json"))
        if not names:
            return None
        try:
            return json.loads(read_own(os.path.join(self.dir, names[-1])))
        except (OSError, ValueError):
            return None
