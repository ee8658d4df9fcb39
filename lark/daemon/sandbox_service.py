"""larkd's `sandbox_limit` operation and the life of each limit it grants (issue 22; lark/daemon/sandbox.py's
SandboxLimiter decides, lark/kernel/sandbox_police.py does the cgroup and nft work).

Kept out of the server (issue 24: the server is transport, admission and dispatch): the checks on the asker, the
cgroup move before the answer, the policers added in the background once the startd's slot ad says the slot's
Bandwidth, and the pidfd watch that removes both when the starter exits.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import os
from collections.abc import Callable, Coroutine
from typing import Any

from .. import protocol
from ..config import Config
from ..errors import LarkError
from ..kernel.sandbox_police import Starter
from ..names import job_key
from . import peercred
from .sandbox import SandboxLimiter, slot_bandwidth

log = logging.getLogger(__name__)

Spawn = Callable[[Coroutine[Any, Any, Any], str], "asyncio.Task[Any]"]


class SandboxService:
    """The sandbox limits of the starters that asked, watched until each starter exits."""

    def __init__(self, cfg: Config, netns_inode: int, ads: Callable[[], object],
                 setup_pool: concurrent.futures.Executor, spawn: Spawn):
        self.cfg = cfg                  # larkd's, changed in place on condor_reconfig
        self.netns_inode = netns_inode  # larkd's network namespace: the one whose sockets the policers see
        self.ads = ads                  # larkd's trusted ad source (read when it is needed: tests replace it)
        self.setup_pool = setup_pool    # cgroup and nft changes: in larkd's setup workers, like a job's network
        self.spawn = spawn
        self.limiter = SandboxLimiter(cfg)
        self.said_unsafe = False   # the pure cgroup v2 refusal is logged once, not at every starter
        self.watches: dict[Starter, int] = {}  # starter whose sandbox transfer is limited -> its pidfd
        # The startd may take a while to answer for the slot ad: never in the setup workers.
        self.ads_pool = concurrent.futures.ThreadPoolExecutor(2, thread_name_prefix="lark-sandbox")

    async def op_limit(self, who: peercred.Peer, slot: object, argv: object) -> bytes:
        """lark-starter, as root, before it execs condor_starter: put it (same pid) into a cgroup of its own now,
        and police that cgroup's sockets at the slot's Bandwidth once the startd's slot ad says what that is
        (in the background: the starter does not wait for the startd)."""
        if not self.cfg.sandbox_limit:
            return protocol.ok(limited=False, reason="LARK_SANDBOX_LIMIT is false")
        unsafe = self.limiter.moves_job_cgroups()
        if unsafe:   # the starter starts unlimited (as with the knob off), its jobs' cgroups where HTCondor puts them
            if not self.said_unsafe:
                log.warning("sandbox transfers not limited: %s", unsafe)
                self.said_unsafe = True
            return protocol.ok(limited=False, reason=unsafe)
        if not isinstance(slot, str) or not isinstance(argv, list) or not all(isinstance(a, str) for a in argv):
            raise LarkError("sandbox_limit needs the slot name and the starter's argv", obj=f"pid {who.pid}",
                            fix="lark-starter sends both; install the same Lark for larkd and lark-starter")
        job_key(slot)   # a valid slot name, or a LarkError naming it
        if peercred.netns_identity(who.pid)[0] != self.netns_inode:
            raise LarkError("the starter runs in another network namespace than larkd, whose rules would not see "
                            "its transfers", obj=f"starter pid {who.pid} (slot {slot})",
                            fix="run larkd in the startd's network namespace")
        peercred.still_same_process(who)
        starter = Starter(who.pid, who.start if who.start is not None else peercred.start_time(who.pid))
        loop = asyncio.get_running_loop()
        path = await loop.run_in_executor(self.setup_pool, self.limiter.join, starter)
        if starter not in self.watches:   # asked again: its policers are on their way already
            self.watch(starter)
            info = peercred.StarterInfo(starter.pid, starter.start, slot, "", list(argv))
            self.spawn(self._add_policers(starter, info), f"sandbox limit of slot {slot}")
        return protocol.ok(limited=True, cgroup=path)

    async def _add_policers(self, starter: Starter, info: peercred.StarterInfo) -> None:
        if starter not in self.watches:   # it exited already
            return
        loop = asyncio.get_running_loop()
        try:
            mbit = await loop.run_in_executor(self.ads_pool, slot_bandwidth, self.ads(), info)
        except LarkError as e:
            log.warning("sandbox transfer of slot %s (starter pid %d) not limited: no slot ad: %s", info.slot,
                        starter.pid, e)
            return
        if mbit is None:
            log.info("sandbox transfer of slot %s (starter pid %d) not limited: the slot has no Bandwidth",
                     info.slot, starter.pid)
            return
        if starter in self.watches:   # not if the starter already exited
            await loop.run_in_executor(self.setup_pool, self.limiter.limit, starter, info.slot, mbit)

    async def adopt(self) -> None:
        """At larkd's start: watch the starters limited before it started (the sweep removed the gone ones)."""
        loop = asyncio.get_running_loop()
        for starter in await loop.run_in_executor(self.setup_pool, self.limiter.live):
            self.watch(starter)

    def watch(self, starter: Starter) -> None:
        if starter in self.watches:
            return
        fd = peercred.pidfd_of_live(starter.pid, starter.start)
        if fd is None:   # the starter ended already
            self.spawn(self._gone(starter, None), f"sandbox limit of starter pid {starter.pid}")
            return
        self.watches[starter] = fd
        asyncio.get_running_loop().add_reader(
            fd, lambda: self.spawn(self._gone(starter, fd), f"sandbox limit of starter pid {starter.pid}"))

    def unwatch_all(self) -> None:
        """Stop watching without removing anything (the limits stay for the next larkd to adopt)."""
        loop = asyncio.get_running_loop()
        for fd in self.watches.values():
            loop.remove_reader(fd)
            os.close(fd)
        self.watches.clear()

    async def _gone(self, starter: Starter, fd: int | None) -> None:
        loop = asyncio.get_running_loop()
        if fd is not None:
            loop.remove_reader(fd)
            os.close(fd)
            if self.watches.get(starter) == fd:
                self.watches.pop(starter, None)
        errors = await loop.run_in_executor(self.setup_pool, self.limiter.remove, starter)
        if errors:
            log.warning("sandbox limit of starter pid %d not fully removed (lark gc retries): %s", starter.pid,
                        "; ".join(errors))
