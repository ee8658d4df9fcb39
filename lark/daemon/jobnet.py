"""Set up and tear down one job's network, recording every completed step.

Teardown works from names derived from the job key, never from what the record says was done, so the same
function cleans a finished job, a half-built one after a crash, and an orphan found by the sweep (CNI DEL).
"""
from __future__ import annotations

import logging
import os
import threading
import time

from pyroute2 import IPRoute

from ..kernel import dhcp, links, netns, shaping
from ..kernel.fairshare import FairShare, link_jobs, shares
from ..kernel.firewall import job_netns
from ..kernel.accounting import Accountant, link_reading
from ..config import Config
from ..errors import LarkError
from ..kernel.firewall.base import Firewall
from ..kernel.attach import make_modes
from ..kernel.attach.base import AttachMode
from ..kernel.ipam import port_pool
from ..names import JobNames
from ..plan import NetworkPlan
from .records import FinishedStore, JobRecord, RecordStore

log = logging.getLogger(__name__)


class JobNetworker:
    def __init__(self, cfg: Config, firewall: Firewall, records: RecordStore, accountant: Accountant,
                 finished: FinishedStore):
        self.cfg = cfg
        self.fw = firewall
        self.records = records
        self.acct = accountant
        self.finished = finished
        self.modes = make_modes(cfg)
        self.leases = dhcp.LeaseCache(os.path.join(cfg.state_dir, "leases"))
        lo, hi = cfg.port_range
        self.ports = port_pool(cfg.ipam_dir, lo, hi)
        self._local = threading.local()
        self.fair = FairShare(cfg.fair_share_floor_mbit)

    @property
    def pools(self) -> list:
        return ([m.pool for m in self.modes.values()] + [m.pool6 for m in self.modes.values() if m.pool6]
                + [self.ports])

    @property
    def supported_types(self) -> list[str]:
        return [*self.modes, "none"]

    def names(self, key: str) -> JobNames:
        return JobNames(key, self.cfg.netns_prefix)

    def netns_path(self, key: str) -> str:
        return os.path.join(self.cfg.netns_dir, self.names(key).netns)

    def setup(self, plan: NetworkPlan, starter_pid: int, starter_start: int, job_pid: int,
              job_ns: int) -> JobRecord:
        if plan.has_network and plan.network_type not in self.modes:
            raise LarkError(f"network type {plan.network_type!r} is not available on this machine", job=plan.job_id,
                            obj="NetworkType", fix=f"make the machine policy choose one of "
                            f"{', '.join(self.supported_types)} (bridge needs bridge_range in lark.toml)")
        n = self.names(plan.key)
        rec = JobRecord(key=plan.key, slot=plan.slot, job_id=plan.job_id, starter_pid=starter_pid,
                        starter_start=starter_start, job_pid=job_pid, netns_inode=job_ns, netns=n.netns,
                        host_if=n.host_if if plan.has_network else "", plan=plan.to_dict())
        self.records.save(rec)  # before any kernel object exists, so a crash from here on leaves a trace
        try:
            self._build(plan, rec, n)
        except Exception as e:
            log.error("setup of job %s on %s failed, undoing: %s", plan.job_id, plan.slot, e)
            rec.error = str(e)
            try:
                self.teardown(plan.key, "setup failed")
            except Exception:
                log.exception("undoing the failed setup of %s also failed; `lark gc` will retry", plan.key)
            if isinstance(e, LarkError):
                raise
            raise LarkError(f"setup failed: {e}", job=plan.job_id, obj=f"slot {plan.slot}") from e
        return rec

    def _build(self, plan: NetworkPlan, rec: JobRecord, n: JobNames) -> None:
        path = self.netns_path(plan.key)
        netns.attach(rec.job_pid, path)
        self.records.step(rec, "netns")
        ns_fd = os.open(path, os.O_RDONLY)
        try:
            if not plan.has_network:
                with netns.netlink_in(ns_fd) as nipr:
                    links.bring_up_job_side(nipr, None)
                self.records.step(rec, "loopback")
            else:
                mode = self.modes[plan.network_type]
                ipr = self._host_netlink()
                mode.ensure_prepared(ipr)
                if mode.name == "bridge":
                    self.fw.ensure_bridge_base()  # the port is filtered from the moment it joins
                use_dhcp = self._reserve(plan, mode, ns_fd)
                rec.plan = plan.to_dict()
                self.records.step(rec, "address")
                links.create_veth(ipr, n.host_if, n.job_if, ns_fd, plan.job_id, n.job_mac if mode.bridged else None)
                self.records.step(rec, "veth")
                host_idx = ipr.link_lookup(ifname=n.host_if)[0]
                mode.attach(ipr, host_idx, plan, n)
                # One netlink socket in the job's netns for everything done there (each costs ~1 ms).
                with netns.netlink_in(ns_fd) as nipr:
                    job_idx = self._address(plan, rec, n, mode, ns_fd, nipr, use_dhcp)
                    with self.fair.lock:  # the limits on the link change one job at a time
                        self._fair_rebalance(ipr, plan)
                        if plan.rate_limit_mbit:
                            limit = shaping.limit_for(plan.rate_limit_mbit, plan.job_id)
                            shaping.apply(ipr, host_idx, nipr, job_idx, limit, plan.job_id)
                            rec.steps.append("shaping")
                            rec.plan = plan.to_dict()
                            self.records.save(rec)
                mode.secure(plan, n)
                if mode.bridged and not plan.inbound:
                    # No bridge conntrack on every kernel: the stateful "no new inbound" filter sits in the
                    # job's own netns, where the job has no CAP_NET_ADMIN to change it.
                    job_netns.block_inbound(ns_fd, self.netns_path(plan.key), plan.job_id)
                self.fw.add_job(plan, n)
                self.acct.start(plan.key, rec.created, n.host_if if mode.counts_by_link else None)
                rec.steps += ["addressing", "firewall"]
        finally:
            os.close(ns_fd)
        rec.phase = "ready"
        self.records.save(rec)

    def _reserve(self, plan: NetworkPlan, mode: AttachMode, ns_fd: int) -> bool:
        """Static addresses (and the inbound port) from the mode's pools; True when IPv4 comes from DHCP."""
        use_dhcp = mode.bridged and plan.address_type == "dhcp" and plan.wants_ipv4
        if plan.wants_ipv4 and not use_dhcp:
            plan.ipv4 = mode.pool.reserve(plan.key, plan.job_id)
            plan.gateway4, plan.ipv4_prefix = mode.gateway, mode.prefix
        if plan.wants_ipv6:
            if mode.pool6 is None:
                raise LarkError(f"the job wants IPv6 but {mode.name} mode has no IPv6 here", job=plan.job_id,
                                obj="IPProtocol", fix="set subnet6 (NAT) or bridge_range6 (bridged) in "
                                "lark.toml, or advertise IPProtocol = \"IPv4\" on this machine")
            plan.ipv6 = mode.pool6.reserve(plan.key, plan.job_id)
            plan.gateway6, plan.ipv6_prefix = mode.gateway6, mode.prefix6
            # Before the job's device exists, so it inherits it: no DAD delay on its addresses.
            netns.write_sysctl_in(ns_fd, "net.ipv6.conf.default.accept_dad", "0")
        if plan.inbound and not mode.bridged:
            plan.inbound_port = int(self.ports.reserve(plan.key, plan.job_id))
        return use_dhcp

    def _address(self, plan: NetworkPlan, rec: JobRecord, n: JobNames, mode: AttachMode, ns_fd: int,
                 nipr: IPRoute, use_dhcp: bool) -> int:
        """Bring the job's side up with its addresses and default routes (IPv4 after DHCP when leased);
        returns the job device's index."""
        idx = links.bring_up_job_side(nipr, n.job_if)
        if use_dhcp:
            lease = self._dhcp_lease(plan, n, ns_fd)
            plan.ipv4, plan.ipv4_prefix = lease.address, lease.prefix
            plan.gateway4 = lease.router or mode.gateway
            plan.dhcp = lease.to_dict()
            rec.plan = plan.to_dict()
            self.records.step(rec, "dhcp")
        if plan.ipv4:
            links.add_job_address(nipr, idx, plan.ipv4, plan.ipv4_prefix, plan.gateway4)
        if plan.ipv6:
            links.add_job_address6(nipr, idx, plan.ipv6, plan.ipv6_prefix, plan.gateway6)
        return idx

    def _dhcp_lease(self, plan: NetworkPlan, n: JobNames, ns_fd: int) -> dhcp.Lease:
        """The slot's cached lease while it is fresh (no DISCOVER at all), else a new one from the server."""
        cached = self.leases.get(plan.key, plan.owner)  # never another owner's lease (nor its address)
        if cached is not None and cached.usable():
            log.info("job %s reuses the slot's DHCP lease %s (server %s)", plan.job_id, cached.address, cached.server)
            return cached
        with netns.entered(ns_fd):
            lease = dhcp.Client(n.job_if, n.job_mac, plan.job_id, owner=plan.owner).acquire()
        self.leases.put(plan.key, lease)
        log.info("job %s got DHCP lease %s/%d from %s for %d s", plan.job_id, lease.address, lease.prefix,
                 lease.server, lease.lease_time)
        return lease

    def renew_leases(self, keys: set[str]) -> None:
        """Renew the leases of running DHCP jobs that are due (T1, or dhcp_renew_interval when shorter)."""
        now = time.time()
        for key in keys:
            rec = self.records.load(key)
            if not rec or not rec.plan.get("dhcp") or rec.phase != "ready":
                continue
            lease = dhcp.Lease.from_dict(rec.plan["dhcp"])
            every = self.cfg.dhcp_renew_interval
            if not (lease.renew_due(now) or (every and now >= lease.obtained + every)):
                continue
            n = self.names(key)
            try:
                fd = os.open(self.netns_path(key), os.O_RDONLY)
                try:
                    with netns.entered(fd):
                        new = dhcp.Client(n.job_if, n.job_mac, rec.job_id).renew(lease)
                finally:
                    os.close(fd)
            except (LarkError, OSError) as e:
                log.error("DHCP renewal for job %s (%s) failed, will retry: %s", rec.job_id, lease.address, e)
                continue
            if new.address != lease.address:
                log.error("DHCP server gave job %s a different address on renewal (%s, had %s); keeping %s",
                          rec.job_id, new.address, lease.address, lease.address)
                continue
            rec.plan["dhcp"] = new.to_dict()
            self.records.save(rec)
            self.leases.put(key, new)
            log.info("renewed DHCP lease %s of job %s for %d s", new.address, rec.job_id, new.lease_time)

    def _release_lease(self, key: str, rec) -> None:
        if not (rec and rec.plan.get("dhcp") and self.cfg.dhcp_release):
            return
        lease = dhcp.Lease.from_dict(rec.plan["dhcp"])
        try:
            fd = os.open(self.netns_path(key), os.O_RDONLY)
            try:
                with netns.entered(fd):
                    dhcp.Client(self.names(key).job_if, self.names(key).job_mac, rec.job_id).release(lease)
            finally:
                os.close(fd)
        except OSError as e:
            log.warning("could not release DHCP lease %s of job %s: %s", lease.address, rec.job_id, e)
        self.leases.drop(key, lease.owner)

    def _fair_rebalance(self, ipr: IPRoute, new: NetworkPlan | None) -> None:
        """Hold `self.fair.lock`. Moves the running unreserved jobs to their fair share of what reservations
        leave, counting `new` (a job being set up); a fair-share `new` gets its own share in its plan."""
        running = link_jobs(self.records.all(), new, lambda k: self.names(k).job_if, self.netns_path)
        for key, mbit in self.fair.rebalance(ipr, running, skip=new.key if new else None).items():
            r = self.records.load(key)
            if r:
                r.plan["rate_limit_mbit"] = mbit
                self.records.save(r)
        if new is not None and new.fair_share_capacity_mbit:
            new.rate_limit_mbit = shares(running, self.fair.floor)[new.key]

    def _host_netlink(self) -> IPRoute:
        # One netlink socket per worker thread, reused across jobs (opening one costs ~1 ms).
        ipr = getattr(self._local, "ipr", None)
        if ipr is None:
            ipr = self._local.ipr = IPRoute()
        return ipr

    def teardown(self, key: str, reason: str) -> dict | None:
        """Remove everything a job key can own; safe to repeat and on partial state."""
        n = self.names(key)
        rec = self.records.load(key)
        if rec:
            rec.phase = "tearing-down"
            self.records.save(rec)
        self._release_lease(key, rec)
        ipr = self._host_netlink()
        link = links.link_stats(ipr, n.host_if)
        reading = self.fw.remove_job(n)
        mode = self.modes.get(rec.plan.get("network_type", "")) if rec else None
        if mode is not None and mode.counts_by_link and link:
            reading = link_reading(link)
        summary = self.acct.final(key, reading, rec.created if rec else None)
        # A record names the job's mode; an orphan found by gc may be in any of them.
        for m in ([mode] if mode is not None else [m for m in self.modes.values() if key in m.job_keys()]):
            m.detach(n)
        links.delete_link(ipr, n.host_if)
        if summary is not None and link:
            # The device's own view, for cross-checking the netfilter counters: host-side tx = toward the job.
            summary["link_bytes_in"] = link["tx_bytes"]
            summary["link_packets_in"] = link["tx_packets"]
            summary["link_bytes_out"] = link["rx_bytes"]
            summary["link_packets_out"] = link["rx_packets"]
        netns.detach(self.netns_path(key))
        for pool in self.pools:
            pool.release(key)
        if rec and summary is not None:
            plan = rec.plan
            summary.update({"job_id": rec.job_id, "slot": rec.slot, "key": key, "ended": time.time(),
                            "started": rec.created, "network_type": plan.get("network_type"),
                            "ipv4": plan.get("ipv4"), "owner": plan.get("owner"),
                            "accounting_group": plan.get("accounting_group"), "reason": reason})
            self.finished.save(key, summary)
        self.records.delete(key)
        if rec and (rec.plan.get("rate_limit_mbit") or rec.plan.get("fair_share_capacity_mbit")):
            with self.fair.lock:  # what this job held goes back to the unreserved jobs
                self._fair_rebalance(ipr, None)
        log.info("tore down network of %s (%s)", rec.job_id if rec else key, reason)
        return summary
