"""Set up and tear down one job's network, recording every completed step.

Teardown works from names derived from the job key, never from what the record says was done, so the same
function cleans a finished job, a half-built one after a crash, and an orphan found by the sweep (CNI DEL).
"""
from __future__ import annotations

import dataclasses
import logging
import os
import threading
import time
from typing import TYPE_CHECKING, overload

from pyroute2 import IPRoute

from ..config import Config
from ..errors import LarkError
from ..kernel.accounting import Accountant
from ..kernel.attach import make_modes
from ..kernel.dhcp import Lease
from ..kernel.fairshare import link_jobs, shares
from ..kernel.firewall.base import Firewall
from ..kernel.ipam import port_pool
from ..kernel.netlink_orphans import drop_orphan_replies
from ..kernel.ops import REAL, KernelOps
from ..kernel.sections import JobSections
from ..names import JobNames, host_mac_seed, set_process_mac_seed
from ..plan import JobNetwork, NetworkPlan
from ..realize.feasibility import HostProfile, check_feasible, host_profile
from ..scitags import parse_collector
from .controller_client import ControllerClient
from .engine import Engine, TeardownErrors
from .pins import merge_usage
from .profiles import NO_NETWORK, Profile, make_profiles
from .records import FinishedStore, JobRecord, RecordStore
from .resources import TRANSFER_NETNS, JobCtx, resources

if TYPE_CHECKING:  # types only: their operations are `self.kernel`'s
    from ..kernel.scitags import FireflyReporter

__all__ = ["TRANSFER_NETNS", "JobNetworker", "TeardownErrors"]

log = logging.getLogger(__name__)


class JobNetworker:
    def __init__(self, cfg: Config, firewall: Firewall, records: RecordStore, accountant: Accountant,
                 finished: FinishedStore, kernel: KernelOps = REAL):
        self.cfg = cfg  # the live knobs (lark/daemon/reload.py updates it); the kernel gets only sections
        self.sections = JobSections.from_config(cfg)  # built once: none of their knobs is live
        self.kernel = kernel  # every kernel call of the orchestration (lark/kernel/ops.py; tests pass a fake)
        self.fw = firewall
        self.records = records
        self.acct = accountant
        self.finished = finished
        self.modes = make_modes(cfg)
        self.leases = kernel.lease_cache(os.path.join(cfg.state_dir, "leases"))
        self.dns = kernel.dns_forwarder(self.sections.dns)
        lo, hi = cfg.port_range
        self.ports = port_pool(cfg.ipam_dir, lo, hi)
        self._local = threading.local()
        self.mac_seed = host_mac_seed(cfg.job_mac_seed)
        set_process_mac_seed(self.mac_seed)
        # Whether a network type registers (bridged) and is tagged: its profile's answer, i.e. its attach mode's.
        self.controller = ControllerClient(cfg, records, traits=lambda network_type: self.profiles.get(network_type))
        self.fair = kernel.fair_share(cfg.fair_share_floor_mbit)
        self._fireflies: FireflyReporter | None = None
        self._profiles: tuple[dict, dict[str, Profile]] | None = None
        self.engine = Engine(resources(self))

    @property
    def fireflies(self) -> FireflyReporter | None:
        """The firefly sender, started on first use (only larkd tears down tagged jobs with a collector set)."""
        if self._fireflies is None and self.cfg.scitags_collector:
            self._fireflies = self.kernel.firefly_reporter(parse_collector(self.cfg.scitags_collector))
        return self._fireflies

    def resume_fireflies(self, rec: JobRecord) -> None:
        """larkd restarted: report a running tagged job's flows again (those that started meanwhile get their end
        firefly only)."""
        if not rec.plan.get("scitag") or self.fireflies is None:
            return
        try:
            fd = os.open(self.netns_path(rec.key), os.O_RDONLY)
            try:
                self.fireflies.watch(rec.key, rec.job_id, fd, rec.plan["scitag"],
                                     {a for a in (rec.plan.get("ipv4"), rec.plan.get("ipv6")) if a})
            finally:
                os.close(fd)
        except OSError as e:
            log.error("job %s: no SciTags fireflies after larkd's restart: %s", rec.job_id, e)

    @property
    def pools(self) -> list:
        return ([m.pool for m in self.modes.values()] + [m.pool6 for m in self.modes.values() if m.pool6]
                + [self.ports])

    @property
    def profiles(self) -> dict[str, Profile]:
        """One profile per mode this EP offers (and `none`); from `modes`, which tests may replace."""
        if self._profiles is None or self._profiles[0] is not self.modes:
            self._profiles = (self.modes, make_profiles(self.modes))
        return self._profiles[1]

    @property
    def supported_types(self) -> list[str]:
        return [*self.modes, "none"]

    def names(self, key: str) -> JobNames:
        return JobNames(key, self.cfg.netns_prefix, self.mac_seed)

    def netns_path(self, key: str) -> str:
        return os.path.join(self.cfg.netns_dir, self.names(key).netns)

    def host_profile(self) -> HostProfile:
        """What this EP offers jobs: the modes made at start, the firewall backend, dhcpcd (looked up each time:
        installing it needs no restart)."""
        return host_profile(self.cfg, self.modes, self.fw.name, self.kernel.dhcpv6_client_installed())

    def check_feasible(self, plan: NetworkPlan) -> None:
        """PREPARE_JOB's check and setup both ask this, so they cannot disagree (lark/realize/feasibility.py)."""
        check_feasible(plan, self.host_profile())

    def setup(self, plan: NetworkPlan, starter_pid: int, starter_start: int, job_pid: int,
              job_ns: int) -> JobRecord:
        self.check_feasible(plan)  # before the record and any kernel object: a refused job leaves nothing
        n = self.names(plan.key)
        if job_pid == TRANSFER_NETNS:
            # For the job's file-transfer plugins, before the job has a namespace: one of larkd's making. Made
            # before the record, named with the job's prefix: if larkd dies here, the sweep finds it by name.
            job_ns = self.kernel.create_netns(self.netns_path(plan.key))
        rec = JobRecord(key=plan.key, slot=plan.slot, job_id=plan.job_id, starter_pid=starter_pid,
                        starter_start=starter_start, job_pid=job_pid, netns_inode=job_ns, netns=n.netns,
                        host_if=n.host_if if plan.has_network else "", plan=JobNetwork(plan).to_dict())
        self.records.save(rec)  # before any kernel object exists, so a crash from here on leaves a trace
        try:
            self._build(JobNetwork(plan), rec, n)  # undoes itself (the whole teardown) when a step fails
        except Exception as e:
            log.error("setup of job %s on %s failed: %s", plan.job_id, plan.slot, e)
            if isinstance(e, LarkError):
                raise
            raise LarkError(f"setup failed: {e}", job=plan.job_id, obj=f"slot {plan.slot}") from e
        return rec

    def _build(self, net: JobNetwork, rec: JobRecord, n: JobNames) -> None:
        """The job's profile's resources, in the engine's order, the record saved after each step that changed it."""
        plan = net.plan
        profile = self.profiles[plan.network_type] if plan.has_network else NO_NETWORK
        ctx = JobCtx(plan.key, n, rec, profile, net=net, ipr=self._host_netlink() if plan.has_network else None)
        saved = [_snapshot(rec)]

        def save(ctx: JobCtx) -> None:
            if _snapshot(rec) != saved[0]:  # each save costs a file write: only when a step changed the record
                self.records.save(rec)
                saved[0] = _snapshot(rec)

        ctx.save = lambda: save(ctx)  # for a step that must save within its own lock (shaping)

        def undo() -> None:
            ctx.stack.close()  # the job's netns handles first: teardown removes the netns
            log.error("setup of job %s on %s failed, undoing", plan.job_id, plan.slot)
            try:
                # Not the job's end: its starter still runs, and larkd carries these figures (pins.py).
                self.teardown(plan.key, "setup failed", final=False)
            except Exception as e:
                log.error("undoing the failed setup of %s was incomplete; `lark gc` will retry: %s", plan.key, e)

        with ctx.stack:
            self.engine.build(ctx, profile.resources, save, undo)
        rec.phase = "ready"
        try:    # a record that cannot say "ready" (disk full) must not leave a built network behind it
            self.records.save(rec)
        except BaseException:
            undo()
            raise

    def renew_leases(self, keys: set[str]) -> None:
        """Renew the leases of running DHCP jobs that are due (T1, or dhcp_renew_interval when shorter)."""
        now = time.time()
        for key in keys:
            rec = self.records.load(key)
            if not rec or not rec.lease or rec.phase != "ready":
                continue
            lease = Lease.from_dict(rec.lease)
            every = self.cfg.dhcp_renew_interval
            if not (lease.renew_due(now) or (every and now >= lease.obtained + every)):
                continue
            n = self.names(key)
            try:
                fd = os.open(self.netns_path(key), os.O_RDONLY)
                try:
                    with self.kernel.entered(fd):
                        new = self.kernel.dhcp_renew(n.job_if, n.job_mac, rec.job_id, lease)
                finally:
                    os.close(fd)
            except (LarkError, OSError) as e:
                log.error("DHCP renewal for job %s (%s) failed, will retry: %s", rec.job_id, lease.address, e)
                continue
            if new.address != lease.address:
                log.error("DHCP server gave job %s a different address on renewal (%s, had %s); keeping %s",
                          rec.job_id, new.address, lease.address, lease.address)
                continue
            rec.renewed_lease = new.to_dict()
            self.records.save(rec)
            self.leases.put(key, new)
            log.info("renewed DHCP lease %s of job %s for %d s", new.address, rec.job_id, new.lease_time)

    @overload
    def fair_rebalance(self, ipr: IPRoute, new: JobNetwork) -> JobNetwork: ...
    @overload
    def fair_rebalance(self, ipr: IPRoute, new: None) -> None: ...
    def fair_rebalance(self, ipr: IPRoute, new: JobNetwork | None) -> JobNetwork | None:
        """Hold `self.fair.lock`. Moves the running unreserved jobs to their fair share of what reservations
        leave, counting `new` (a job being set up); a fair-share `new` comes back with its own share as its
        limit (a new plan: the decided one is never changed)."""
        running = link_jobs(self.records.all(), new.plan if new else None, lambda k: self.names(k).job_if,
                            self.netns_path)
        for key, mbit in self.fair.rebalance(ipr, running, skip=new.key if new else None).items():
            r = self.records.load(key)
            if r:
                r.rebalanced_mbit = mbit
                self.records.save(r)
        if new is not None and new.fair_share_capacity_mbit:
            share = shares(running, self.fair.floor)[new.key]
            return JobNetwork(dataclasses.replace(new.plan, rate_limit_mbit=share), new.addrs)
        return new

    def _host_netlink(self) -> IPRoute:
        # One netlink socket per worker thread, reused across jobs (opening one costs ~1 ms).
        ipr = getattr(self._local, "ipr", None)
        if ipr is None:
            ipr = self._local.ipr = self.kernel.host_netlink()
        else:
            # pyroute2 0.9.7 leaves each single-object get's ACK queued for nobody; unbounded, ~30 MB of larkd's
            # RSS after 128 jobs (lark/kernel/netlink_orphans.py)
            drop_orphan_replies(ipr)
        return ipr

    def teardown(self, key: str, reason: str, carried: dict | None = None, final: bool = True) -> dict | None:
        """Remove everything a job key can own; safe to repeat and on partial state.

        Every step runs even when an earlier one failed (a firewall that cannot remove its rules must not leave
        the veth, the namespace and the addresses behind). The failures are collected and raised together at
        the end as one TeardownError; the record is then kept, so `lark gc` and the next start try again.
        `carried`: what the job moved on networks it had before this one (added to the summary); `final`:
        the job has ended, so its summary goes to the finished records (else the caller carries it).
        """
        n = self.names(key)
        errors = TeardownErrors(key)
        rec = errors.run("read the record", self.records.load, key)
        if rec:
            rec.phase = "tearing-down"
            errors.run("mark the record", self.records.save, rec)
        ipr = self._host_netlink()
        ctx = JobCtx(key, n, rec, None, ipr=ipr)
        self.engine.teardown(ctx, errors)  # every resource, by phase (engine.Phase says why in that order)
        summary = ctx.summary
        summary = merge_usage(carried, summary)
        if rec and summary is not None and final:
            summary = errors.run("save the final accounting", self.finished.finish, key, summary, reason, rec)
        if errors:
            raise errors.error(rec.job_id if rec else None)
        self.records.delete(key)
        if rec and (rec.rate_limit_mbit or rec.plan.get("fair_share_capacity_mbit")):
            with self.fair.lock:  # what this job held goes back to the unreserved jobs
                self.fair_rebalance(ipr, None)
        log.info("tore down network of %s (%s)", rec.job_id if rec else key, reason)
        return summary



def _snapshot(rec: JobRecord) -> tuple:
    return (rec.plan, rec.shaped, rec.phase)
