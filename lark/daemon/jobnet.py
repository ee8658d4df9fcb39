"""Set up and tear down one job's network, recording every completed step.

Teardown works from names derived from the job key, never from what the record says was done, so the same
function cleans a finished job, a half-built one after a crash, and an orphan found by the sweep (CNI DEL).
"""
from __future__ import annotations

import dataclasses
import logging
import os
import shutil
import threading
import time
from typing import overload

from pyroute2 import IPRoute

from ..config import Config
from ..errors import LarkError
from ..kernel import dhcp, dhcp6, dns, ipv6auto, links, mtu, netns, scitags, shaping
from ..kernel.accounting import Accountant, link_reading
from ..kernel.attach import make_modes
from ..kernel.attach.base import AttachMode
from ..kernel.fairshare import FairShare, link_jobs, shares
from ..kernel.firewall import job_netns
from ..kernel.firewall.base import Firewall
from ..kernel.ipam import port_pool
from ..kernel.scitags import FireflyReporter
from ..names import JobNames, host_mac_seed, set_process_mac_seed
from ..plan import JobNetwork, NetworkPlan
from ..realize.feasibility import HostProfile, check_feasible, host_profile
from ..scitags import parse_collector
from .controller_client import ControllerClient
from .pins import merge_usage
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
        self.dns = dns.Forwarder(cfg)
        lo, hi = cfg.port_range
        self.ports = port_pool(cfg.ipam_dir, lo, hi)
        self._local = threading.local()
        self.mac_seed = host_mac_seed(cfg.job_mac_seed)
        set_process_mac_seed(self.mac_seed)
        self.controller = ControllerClient(cfg, records)
        self.fair = FairShare(cfg.fair_share_floor_mbit)
        self._fireflies: FireflyReporter | None = None

    @property
    def fireflies(self) -> FireflyReporter | None:
        """The firefly sender, started on first use (only larkd tears down tagged jobs with a collector set)."""
        if self._fireflies is None and self.cfg.scitags_collector:
            self._fireflies = FireflyReporter(parse_collector(self.cfg.scitags_collector))
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
    def supported_types(self) -> list[str]:
        return [*self.modes, "none"]

    def names(self, key: str) -> JobNames:
        return JobNames(key, self.cfg.netns_prefix, self.mac_seed)

    def netns_path(self, key: str) -> str:
        return os.path.join(self.cfg.netns_dir, self.names(key).netns)

    def host_profile(self) -> HostProfile:
        """What this EP offers jobs: the modes made at start, the firewall backend, dhcpcd (looked up each time:
        installing it needs no restart)."""
        return host_profile(self.cfg, self.modes, self.fw.name, shutil.which(dhcp6.CLIENT) is not None)

    def check_feasible(self, plan: NetworkPlan) -> None:
        """PREPARE_JOB's check and setup both ask this, so they cannot disagree (lark/realize/feasibility.py)."""
        check_feasible(plan, self.host_profile())

    def setup(self, plan: NetworkPlan, starter_pid: int, starter_start: int, job_pid: int,
              job_ns: int) -> JobRecord:
        self.check_feasible(plan)  # before the record and any kernel object: a refused job leaves nothing
        n = self.names(plan.key)
        rec = JobRecord(key=plan.key, slot=plan.slot, job_id=plan.job_id, starter_pid=starter_pid,
                        starter_start=starter_start, job_pid=job_pid, netns_inode=job_ns, netns=n.netns,
                        host_if=n.host_if if plan.has_network else "", plan=JobNetwork(plan).to_dict())
        self.records.save(rec)  # before any kernel object exists, so a crash from here on leaves a trace
        try:
            self._build(JobNetwork(plan), rec, n)
        except Exception as e:
            log.error("setup of job %s on %s failed, undoing: %s", plan.job_id, plan.slot, e)
            try:
                # Not the job's end: its starter still runs, and larkd carries these figures (pins.py).
                self.teardown(plan.key, "setup failed", final=False)
            except Exception as undo:
                log.error("undoing the failed setup of %s was incomplete; `lark gc` will retry: %s", plan.key, undo)
            if isinstance(e, LarkError):
                raise
            raise LarkError(f"setup failed: {e}", job=plan.job_id, obj=f"slot {plan.slot}") from e
        return rec

    def _build(self, net: JobNetwork, rec: JobRecord, n: JobNames) -> None:
        plan = net.plan
        path = self.netns_path(plan.key)
        netns.attach(rec.job_pid, path, expect_inode=rec.netns_inode)
        ns_fd = os.open(path, os.O_RDONLY)
        try:
            if not plan.has_network:
                with netns.netlink_in(ns_fd) as nipr:
                    links.bring_up_job_side(nipr, None)
            else:
                mode = self.modes[plan.network_type]
                ipr = self._host_netlink()
                mode.ensure_prepared(ipr)
                if mode.name == "bridge":
                    self.fw.ensure_bridge_base()  # the port is filtered from the moment it joins
                net, use_dhcp = self._reserve(net, mode, ns_fd)
                rec.plan = net.to_dict()
                self.records.save(rec)  # the reserved addresses, for the record and `lark status`
                links.create_veth(ipr, n.host_if, n.job_if, ns_fd, plan.job_id, n.job_mac if mode.bridged else None,
                                  mtu.for_job(ipr, self.cfg, plan.network_type))
                host_idx = ipr.link_lookup(ifname=n.host_if)[0]
                mode.attach(ipr, host_idx, net, n)  # before DHCP: bridged, the server is behind the bridge
                # One netlink socket in the job's netns for everything done there (each costs ~1 ms).
                with netns.netlink_in(ns_fd) as nipr:
                    job_idx = links.bring_up_job_side(nipr, n.job_if)
                    mode.wait_forwarding(ipr, host_idx, plan.job_id)  # else the first frame is dropped
                    if use_dhcp:
                        net = self._lease_address(net, rec, n, mode, ns_fd)
                    net = self._address(net, rec, mode, nipr, job_idx)
                    dns.setup_job(self.dns, ipr, plan.network_type, net.ipv4, ns_fd, self.netns_path(plan.key),
                                  n.job_if, job_idx, plan.job_id)
                    with self.fair.lock:  # the limits on the link change one job at a time
                        net = self._fair_rebalance(ipr, net)
                        if net.rate_limit_mbit:
                            limit = shaping.limit_for(net.rate_limit_mbit, plan.job_id)
                            shaping.apply(ipr, host_idx, nipr, job_idx, limit, plan.job_id)
                            rec.shaped = True
                            rec.plan = net.to_dict()
                            self.records.save(rec)
                mode.secure(net, n)
                # In the job's own netns, where the job has no CAP_NET_ADMIN to change it: the DHCP guard (only
                # larkd's DHCP messages leave), and the stateful "no new inbound" filter (bridged frames have no
                # conntrack on every kernel, and a NAT job's connections from the EP host itself are local output
                # that the forward hook never sees).
                job_netns.secure(ns_fd, plan.job_id, block_inbound=not plan.inbound,
                                 dhcpv6_client=self._dhcpv6(plan, mode))
                if plan.scitag:  # in the job's netns too: the tag bits after anything the job chose
                    scitags.secure(ns_fd, plan.job_id, plan.scitag, fireflies=self.fireflies is not None)
                    if self.fireflies is not None:
                        self.fireflies.watch(plan.key, plan.job_id, ns_fd, plan.scitag,
                                             {a for a in (net.ipv4, net.ipv6) if a})
                # Before the answer to the wrapper: the pool switch has the job's flows before its program runs.
                decision = self.controller.register(net, n.job_mac if mode.bridged else "")
                if decision.get("blocked_by") or decision.get("wan_drop"):
                    # The switch drops the job's traffic (or its WAN traffic), but its DNS goes to the forwarder on
                    # this host, before the switch, and on from the host's resolver: name lookups would be its
                    # tunnel out. So the firewall admits it to no DNS.
                    net = net.with_addresses(dns_revoked_by=decision.get("blocked_by") or decision["wan_policy"])
                    rec.plan = net.to_dict()
                    log.info("job %s: no DNS, as the pool controller's policy %s drops its %s", plan.job_id,
                             net.dns_revoked_by, "traffic" if decision.get("blocked_by") else "WAN traffic")
                self.fw.add_job(net, n)
                self.acct.start(plan.key, rec.created, n.host_if if mode.counts_by_link else None)
        finally:
            os.close(ns_fd)
        rec.phase = "ready"
        self.records.save(rec)

    def _reserve(self, net: JobNetwork, mode: AttachMode, ns_fd: int) -> tuple[JobNetwork, bool]:
        """Static addresses (and the inbound port) from the mode's pools; True when IPv4 comes from DHCP."""
        plan = net.plan
        got: dict = {}
        use_dhcp = mode.bridged and plan.address_type == "dhcp" and plan.wants_ipv4
        if plan.wants_ipv4 and not use_dhcp:
            got.update(ipv4=mode.pool.reserve(plan.key, plan.job_id), gateway4=mode.gateway, ipv4_prefix=mode.prefix)
        if self._slaac(plan, mode) or self._dhcpv6(plan, mode):
            # The address comes from the site's router or DHCPv6 server (in _address).
            ipv6auto.prepare_job_netns(ns_fd, autoconf=self._slaac(plan, mode))
        elif plan.wants_ipv6:
            assert mode.pool6 is not None, "check_feasible refuses IPv6 jobs of modes without an IPv6 source"
            got.update(ipv6=mode.pool6.reserve(plan.key, plan.job_id), gateway6=mode.gateway6,
                       ipv6_prefix=mode.prefix6)
            # Before the job's device exists, so it inherits it: no DAD delay on its addresses.
            netns.write_sysctl_in(ns_fd, "net.ipv6.conf.default.accept_dad", "0")
        if plan.inbound and not mode.bridged:
            got["inbound_port"] = int(self.ports.reserve(plan.key, plan.job_id))
        return net.with_addresses(**got), use_dhcp

    def _lease_address(self, net: JobNetwork, rec: JobRecord, n: JobNames, mode: AttachMode,
                       ns_fd: int) -> JobNetwork:
        """IPv4 from DHCP (the job's device must be up); recorded at once so teardown releases the lease."""
        lease = self._dhcp_lease(net.plan, n, ns_fd)
        net = net.with_addresses(ipv4=lease.address, ipv4_prefix=lease.prefix,
                                 gateway4=lease.router or mode.gateway, dhcp=lease.to_dict())
        rec.plan = net.to_dict()
        self.records.save(rec)
        return net

    def _address(self, net: JobNetwork, rec: JobRecord, mode: AttachMode, nipr: IPRoute, idx: int) -> JobNetwork:
        """The job's addresses and default routes on its (already up) device; with SLAAC, waits for the
        address the site's router advertisement gives it and returns the network with it."""
        if net.addrs.ipv4:
            links.add_job_address(nipr, idx, net.addrs.ipv4, net.addrs.ipv4_prefix, net.addrs.gateway4)
        if net.addrs.ipv6:
            links.add_job_address6(nipr, idx, net.addrs.ipv6, net.addrs.ipv6_prefix, net.addrs.gateway6)
        elif self._slaac(net.plan, mode):
            ipv6, prefix = ipv6auto.wait_for_slaac(nipr, idx, net.plan.job_id, self.cfg.slaac_timeout)
            net = net.with_addresses(ipv6=ipv6, ipv6_prefix=prefix)
            rec.plan = net.to_dict()
            self.records.save(rec)
        elif self._dhcpv6(net.plan, mode):
            n = self.names(net.plan.key)
            ipv6, prefix = dhcp6.acquire(self.cfg, net.plan.key, self.netns_path(net.plan.key), n.job_if, nipr, idx,
                                         net.plan.job_id, self.cfg.dhcpv6_timeout)
            net = net.with_addresses(ipv6=ipv6, ipv6_prefix=prefix)
            rec.plan = net.to_dict()
            self.records.save(rec)
        return net

    def _slaac(self, plan: NetworkPlan, mode: AttachMode) -> bool:
        return mode.bridged and plan.wants_ipv6 and self.cfg.bridge_ipv6 == "slaac"

    def _dhcpv6(self, plan: NetworkPlan, mode: AttachMode) -> bool:
        return mode.bridged and plan.wants_ipv6 and self.cfg.bridge_ipv6 == "dhcpv6"

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

    @overload
    def _fair_rebalance(self, ipr: IPRoute, new: JobNetwork) -> JobNetwork: ...
    @overload
    def _fair_rebalance(self, ipr: IPRoute, new: None) -> None: ...
    def _fair_rebalance(self, ipr: IPRoute, new: JobNetwork | None) -> JobNetwork | None:
        """Hold `self.fair.lock`. Moves the running unreserved jobs to their fair share of what reservations
        leave, counting `new` (a job being set up); a fair-share `new` comes back with its own share as its
        limit (a new plan: the decided one is never changed)."""
        running = link_jobs(self.records.all(), new.plan if new else None, lambda k: self.names(k).job_if,
                            self.netns_path)
        for key, mbit in self.fair.rebalance(ipr, running, skip=new.key if new else None).items():
            r = self.records.load(key)
            if r:
                r.plan["rate_limit_mbit"] = mbit
                self.records.save(r)
        if new is not None and new.fair_share_capacity_mbit:
            share = shares(running, self.fair.floor)[new.key]
            return JobNetwork(dataclasses.replace(new.plan, rate_limit_mbit=share), new.addrs)
        return new

    def _host_netlink(self) -> IPRoute:
        # One netlink socket per worker thread, reused across jobs (opening one costs ~1 ms).
        ipr = getattr(self._local, "ipr", None)
        if ipr is None:
            ipr = self._local.ipr = IPRoute()
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
        errors.run("release the DHCP lease", self._release_lease, key, rec)
        if rec:
            errors.run("unregister from the controller", self.controller.unregister, key, rec.job_id)
        ipr = self._host_netlink()
        link = errors.run("read the veth counters", links.link_stats, ipr, n.host_if)
        reading = errors.run(f"remove the {self.fw.name} rules", self.fw.remove_job, n)
        mode = self.modes.get(rec.plan.get("network_type", "")) if rec else None
        if mode is not None and mode.counts_by_link and link:
            reading = link_reading(link)
        summary = errors.run("close the accounting", self.acct.final, key, reading, rec.created if rec else None)
        # A record names the job's mode; an orphan found by gc may be in any of them.
        if mode is not None:
            holders = [mode]
        else:
            holders = [m for m in self.modes.values() if key in (errors.run(f"list {m.name} ports", m.job_keys) or ())]
        for m in holders:
            errors.run(f"detach from {m.name}", m.detach, n)
        errors.run(f"delete {n.host_if}", links.delete_link, ipr, n.host_if)
        if summary is not None and link:
            # The device's own view, for cross-checking the netfilter counters: host-side tx = toward the job.
            summary["link_bytes_in"] = link["tx_bytes"]
            summary["link_packets_in"] = link["tx_packets"]
            summary["link_bytes_out"] = link["rx_bytes"]
            summary["link_packets_out"] = link["rx_packets"]
        # Before the netns goes: a running client would keep the namespace alive.
        errors.run("stop the DHCPv6 client", dhcp6.stop, self.cfg, key)
        errors.run("stop the IPv6 DNS relay", dns.dns6.stop_relay, self.cfg, self.netns_path(key))
        if self.fireflies is not None:  # before the netns goes: its end fireflies come from its conntrack table
            errors.run("send the SciTags end fireflies", self.fireflies.finish, key)
        errors.run(f"remove netns {n.netns}", netns.detach, self.netns_path(key))
        for pool in self.pools:
            errors.run(f"release the {pool.what}", pool.release, key)
        summary = merge_usage(carried, summary)
        if rec and summary is not None and final:
            plan = rec.plan
            summary.update({"job_id": rec.job_id, "slot": rec.slot, "key": key, "ended": time.time(),
                            "started": rec.created, "network_type": plan.get("network_type"),
                            "ipv4": plan.get("ipv4"), "owner": plan.get("owner"),
                            "accounting_group": plan.get("accounting_group"), "reason": reason,
                            "global_job_id": plan.get("global_job_id"), "rate_limit_mbit": plan.get("rate_limit_mbit"),
                            "request_bandwidth_mbit": plan.get("request_bandwidth_mbit")})
            errors.run("save the final accounting", self.finished.save, key, summary)
        if errors:
            raise errors.error(rec.job_id if rec else None)
        self.records.delete(key)
        if rec and (rec.plan.get("rate_limit_mbit") or rec.plan.get("fair_share_capacity_mbit")):
            with self.fair.lock:  # what this job held goes back to the unreserved jobs
                self._fair_rebalance(ipr, None)
        log.info("tore down network of %s (%s)", rec.job_id if rec else key, reason)
        return summary


class TeardownErrors:
    """netavark's error list: run every teardown step, remember what failed, report it all at the end."""

    def __init__(self, key: str):
        self.key = key
        self.failed: list[str] = []

    def run(self, what: str, fn, *args):
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
