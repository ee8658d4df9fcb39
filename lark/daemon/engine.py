"""The engine that builds and removes one job's network from a list of resources declared once.

A resource is one piece of per-job state (the netns, the veth, the lease, the firewall rules...): `add` makes it,
`remove` takes it away by the job's names alone (idempotent, so it serves a finished job, a half-built one and an
orphan alike), `keys` says which job keys still hold one (what `lark gc` looks for). The engine adds a profile's
resources in list order, saving the job's record after each step (the record store writes the file only when a
crash would need the change: records.crash_view); teardown runs every resource's `remove` (all of
them, whatever the profile: an orphan's mode is not known), phase by phase and within a phase in reverse list
order, going on past failures; gc's orphans are the union of every resource's `keys`. Setup, teardown and gc thus
come from one list and cannot drift apart.

Teardown is not a plain reverse of setup because some state must be read or stopped before other state goes (the
phases below say which and why).
"""
from __future__ import annotations

import enum
import logging
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Protocol

from ..errors import LarkError

log = logging.getLogger(__name__)


class Phase(enum.IntEnum):
    """When a resource's `remove` runs in a teardown (lowest first)."""
    # What other hosts hold for the job (the DHCP server's lease, the pool controller's flows): given back first,
    # while the job's link still exists to send the DHCP RELEASE through.
    RELEASE = 0
    # The pool controller's flows for the job: after the DHCP lease, so the RELEASE still crosses the pool switch.
    UNREGISTER = 1
    # The firewall's counters and the veth's: read (and the rules removed) before the veth goes, since the
    # job's summary is built from them.
    COUNT = 2
    # The attach mode's objects and the veth itself.
    UNLINK = 3
    # Processes and readers inside the job's netns (the DHCPv6 client, the IPv6 DNS relay, the SciTags firefly
    # reporter, which sends end fireflies from the netns' conntrack table): a running process would keep the
    # namespace alive, a reader needs it there.
    DRAIN = 4
    # The netns; what lived only in it (addresses, routes, the job-netns filter) goes with it.
    NETNS = 5
    # Addresses and ports back to the pools last: no new job gets an address the old one may still hold.
    POOLS = 6


class Resource(Protocol):
    """One piece of per-job state."""
    name: str       # what it is, for errors ("veth", "DHCP lease")
    phase: Phase    # when its remove runs in a teardown

    def add(self, ctx: Any) -> None:
        """Make it for the job in `ctx` (may raise; the engine's caller undoes)."""

    def remove(self, ctx: Any, errors: TeardownErrors) -> None:
        """Take it away by the job's names; safe to repeat and on partial state. Each failing step goes to
        `errors.run` so the other steps still run."""

    def keys(self) -> Iterable[tuple[str, str]]:
        """(job key, what) for every job that still holds one (for gc)."""

    # Optional: `check(ctx) -> list[Finding]`, is it there as recorded (read-only; `lark status --verify`).


class TeardownErrors:
    """netavark's error list: run every teardown step, remember what failed, report it all at the end."""

    def __init__(self, key: str):
        self.key = key
        self.failed: list[str] = []

    def run(self, what: str, fn: Callable[..., Any], *args: Any) -> Any:
        try:
            return fn(*args)
        except Exception as e:  # any failure of one step; the others still run
            log.error("teardown of %s: could not %s: %s", self.key, what, e)
            self.failed.append(f"could not {what}: {e}")
            return None

    def __bool__(self) -> bool:
        return bool(self.failed)

    def error(self, job_id: str | None) -> LarkError:
        return LarkError(f"teardown finished with {len(self.failed)} error(s): " + "; ".join(self.failed),
                         job=job_id, obj=f"job key {self.key}",
                         fix="fix the cause, then run `lark gc` (the record is kept so it retries)")


class Engine:
    """Adds resources in order and removes all of them by phase; the list is the only place their order lives."""

    def __init__(self, resources: Sequence[Resource]):
        names = [r.name for r in resources]
        if len(set(names)) != len(names):
            raise ValueError(f"resource names must be unique: {names}")
        self.resources = list(resources)
        self.by_name = {r.name: r for r in resources}

    def select(self, names: Iterable[str]) -> list[Resource]:
        """The named resources in the engine's order (a profile names its resources; the order is the engine's)."""
        wanted = set(names)
        unknown = wanted - set(self.by_name)
        if unknown:
            raise ValueError(f"no such resources: {sorted(unknown)}")
        return [r for r in self.resources if r.name in wanted]

    def build(self, ctx: Any, names: Iterable[str], save: Callable[[Any], None],
              undo: Callable[[], object]) -> None:
        """Add the named resources in order, `save` after each; on the first failure `undo` (normally the whole
        teardown: every remove, which is idempotent) and re-raise."""
        try:
            for r in self.select(names):
                r.add(ctx)
                save(ctx)
        except BaseException:
            undo()
            raise

    def teardown_order(self) -> list[Resource]:
        """Phase by phase; within a phase the reverse of setup order (last made, first gone)."""
        indexed = list(enumerate(self.resources))
        return [r for _, r in sorted(indexed, key=lambda ir: (ir[1].phase, -ir[0]))]

    def teardown(self, ctx: Any, errors: TeardownErrors) -> None:
        """Every resource's remove (whatever the job's profile was), going on past failures into `errors`."""
        for r in self.teardown_order():
            try:
                r.remove(ctx, errors)
            except Exception as e:  # a remove should report through errors.run; one that raises still must not
                errors.run(f"remove the {r.name}", _reraise, e)  # stop the others

    def check(self, ctx: Any, names: Iterable[str]) -> list:
        """`lark status --verify`: the named resources' findings, in setup order (a check may fill in what a later
        one reads, as the veth's does the device indexes)."""
        found: list = []
        for r in self.select(names):
            check = getattr(r, "check", None)
            if check is not None:
                found += check(ctx)
        return found

    def keys(self) -> dict[str, list[str]]:
        """gc's view: job key -> what each resource still holds of it, in the engine's order."""
        found: dict[str, list[str]] = {}
        for r in self.resources:
            for key, what in r.keys():  # noqa: SIM118 (a resource's keys(), not a dict's)
                found.setdefault(key, []).append(what)
        return found


def _reraise(e: Exception) -> None:
    raise e
