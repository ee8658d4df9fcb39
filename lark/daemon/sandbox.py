"""The sandbox transfer (starter <-> shadow) limited to the slot's Bandwidth (issue 22, LARK_SANDBOX_LIMIT).

HTCondor's starter moves a job's input and output sandbox itself, in the execution point's own network namespace,
before and after the job runs. lark-starter (lark/job/starter_wrapper.py) asks larkd with `sandbox_limit` before it
execs condor_starter; larkd puts the asker (the starter-to-be, same pid) into a cgroup v2 of its own,
`<cgroup2 mount>/<sandbox_cgroup>/starter-<pid>-<start>`, so the starter and every process it forks (the transfer
fork) create their sockets there, and adds two policers to the nftables table `<nft_table>_sandbox` in the EP's
netns, in an output and an input chain. When the starter exits (larkd watches its pidfd) both go; `lark gc` and
larkd's start remove what a starter that is gone left (sweep()).

This module decides: whether this host can limit (and whether moving a starter would move its jobs' cgroups),
which starter, at which rate, when (never policers for a starter already removed), what is an orphan (its starter
is gone) and when the shared table and parent may go (no live starter holds them). The cgroup and nft work itself
is lark/kernel/sandbox_police.py's (why cgroup v2 and nft's `socket cgroupv2`: see there).
"""
from __future__ import annotations

import contextlib
import logging
import os
import threading

from ..config import Config
from ..errors import LarkError
from ..kernel.sandbox_police import (
    CHAINS,
    NFT_CGROUP_ROOT,
    Nft,
    SandboxPolice,
    Starter,
    cgroup2_mount,
    check_policer,
    job_cgroups_follow_the_starter,
)
from . import peercred

log = logging.getLogger(__name__)


class SandboxLimiter:
    """Per-starter cgroups and their nft policers: add (join + limit), remove, what gc finds, check."""

    def __init__(self, cfg: Config, nft: Nft | None = None, cg2: str | None = None,
                 nft_root: str = NFT_CGROUP_ROOT):
        self.cfg = cfg
        self.police = SandboxPolice(cgroup2_mount() if cg2 is None else (cg2 or None),   # "": none (tests)
                                    nft_root, cfg.sandbox_cgroup, f"{cfg.nft_table}_sandbox", nft)
        self.nft = self.police.nft
        self.table = self.police.table
        self.parent = self.police.parent
        # limit() (after the slot ad came) and remove() (the starter exited) may run at once in two workers: one
        # at a time, so policers are never added after their starter's removal listed the rules.
        self.lock = threading.Lock()

    # -- where ---------------------------------------------------------------------------------------
    def unavailable(self) -> str | None:
        """Why this host cannot limit the sandbox (None: it can)."""
        return self.police.unavailable()

    def moves_job_cgroups(self) -> str | None:
        """Why moving a starter here would move its jobs' cgroups too (None: it would not)."""
        return job_cgroups_follow_the_starter(self.police.nft_root)

    def cgroup_dir(self, s: Starter) -> str:
        return self.police.cgroup_dir(s)

    # -- add -----------------------------------------------------------------------------------------
    def join(self, s: Starter) -> str:
        """Make the starter's cgroup and move the starter into it (its later forks follow)."""
        why = self.unavailable()
        if why:
            raise LarkError(why, obj=f"sandbox limit of starter pid {s.pid}",
                            fix="mount cgroup2 under /sys/fs/cgroup, or set LARK_SANDBOX_LIMIT = false")
        return self.police.join(s)

    def limit(self, s: Starter, slot: str, mbit: float) -> None:
        """The two policers for this starter's cgroup (replacing any it had)."""
        check_policer(s, slot, mbit)
        with self.lock:
            self._limit(s, slot, mbit)

    def _limit(self, s: Starter, slot: str, mbit: float) -> None:
        if not self.police.has_cgroup(s):
            log.info("sandbox transfer of slot %s (starter pid %d) not limited: its starter is gone", slot, s.pid)
            return
        self.police.ensure_table()
        errors: list[str] = []
        self.police.delete_policers(s, errors)
        if errors:   # else a second pair of policers would join the first
            raise LarkError(f"cannot replace the sandbox policers of starter pid {s.pid}: {'; '.join(errors)}",
                            obj=f"nft table inet {self.table}", fix="lark gc (as root), then restart the job")
        self.police.add_policers(s, slot, mbit)
        log.info("sandbox transfer of slot %s (starter pid %d) limited to %g Mbit/s each way", slot, s.pid, mbit)

    # -- remove --------------------------------------------------------------------------------------
    def remove(self, s: Starter) -> list[str]:
        """Rules first (their cgroup id would dangle), then the cgroup. Goes on past errors; returns them."""
        with self.lock:
            errors: list[str] = []
            self.police.delete_policers(s, errors)
            self.police.remove_cgroup(s, errors)
            return errors

    # -- what is there -------------------------------------------------------------------------------
    def keys(self) -> dict[Starter, list[str]]:
        """Every starter something is held for, and what: 'cgroup', 'rule in sandbox_out', ..."""
        found: dict[Starter, list[str]] = {}
        for s in self.police.cgroups():
            found.setdefault(s, []).append(f"cgroup {self.cgroup_dir(s)}")
        with contextlib.suppress(LarkError):
            for p in self.police.policers():
                found.setdefault(p.starter, []).append(f"nft rule in {self.table} {p.chain}")
        return found

    def live(self) -> list[Starter]:
        return [s for s in self.keys() if peercred.alive(s.pid, s.start)]

    def sweep(self, dry_run: bool = False) -> list[str]:
        """Remove what starters that are gone left; one failure does not stop the others."""
        actions = []
        for s, whats in sorted(self.keys().items(), key=lambda kv: kv[0].pid):
            if peercred.alive(s.pid, s.start):
                continue
            action = f"sandbox limit of gone starter pid {s.pid}: " + ", ".join(whats)
            if not dry_run:
                failed = self.remove(s)
                if failed:
                    action += f" (incomplete: {'; '.join(failed)}; run gc again once fixed)"
            actions.append(action)
        return actions

    def purge(self) -> list[str]:
        """`lark gc --purge`: the shared objects, once no live starter holds anything: the nft table and the
        cgroups' parent (an uninstall, or a test bed's stop, leaves nothing in the machine's cgroup tree)."""
        live = self.live()
        if live:
            return [f"nft table inet {self.table} and cgroup {self.parent} (kept: {len(live)} live starter(s) "
                    f"limited, e.g. pid {live[0].pid})"]
        return [a for a in (self.police.delete_table(), self.police.remove_parent()) if a]

    def check(self, s: Starter) -> list[str]:
        """What a live, limited starter lacks (empty: both policers and its cgroup are there)."""
        problems = []
        if not self.police.has_cgroup(s):
            problems.append(f"cgroup {self.cgroup_dir(s)} is missing")
        chains = {p.chain for p in self.police.policers() if p.starter == s}
        problems += [f"no policer in {self.table} {chain}" for chain in CHAINS if chain not in chains]
        return problems

    def counters(self, s: Starter) -> dict[str, int]:
        """Bytes each policer's counter saw (chain -> bytes)."""
        return self.police.counters(s)


def slot_bandwidth(ads: object, starter: peercred.StarterInfo) -> float | None:
    """The slot ad's Bandwidth (Mbit/s) from larkd's trusted ad source; None when the slot has none."""
    slot_ad = getattr(ads, "slot_ad", None)
    if slot_ad is not None:   # StartdAdSource: the startd's own ad of the claimed slot
        ad = slot_ad(starter)
    else:                     # FileAdSource: <ad_dir>/<slot>.machine.ad, root-owned
        ad = ads._trusted(os.path.join(ads.dir, f"{starter.slot}.machine.ad"), starter.slot)  # type: ignore[attr-defined]
    value = ad.get("Bandwidth") if ad is not None else None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        return None
    return float(value)
