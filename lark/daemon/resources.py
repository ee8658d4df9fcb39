"""Every piece of one job's network, declared once: how it is made, removed, and found by gc.

`resources(host)` is the list in setup order; lark/daemon/engine.py builds a profile's part of it (profiles.py),
tears all of it down by phase, and unions its keys for gc. Each `remove` works from the job's names (and its
record, when there is one), so it cleans a finished job, a half-built one and an orphan alike.

Where kernel state is touched: only through the host's `kernel` (lark/kernel/ops.py: the real kernel, or the unit
tests' fake), the attach mode and the firewall driver, all three given to the JobNetworker.
"""
from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from ..config import Config
from ..errors import LarkError
from ..kernel import shaping
from ..kernel.accounting import Accountant, link_reading
from ..kernel.dhcp import Lease
from ..kernel.drift import Finding, drifted
from ..kernel.firewall.base import Firewall
from ..kernel.ipam import LockPool
from ..kernel.ops import KernelOps
from ..kernel.sections import JobSections
from ..names import HOST_IF_PREFIX, JobNames, key_from_host_if
from ..plan import JobNetwork
from .controller_client import ControllerClient
from .engine import Phase, TeardownErrors
from .profiles import Profile
from .records import JobRecord, RecordStore

if TYPE_CHECKING:  # types only: their operations are the host's `kernel`'s
    from ..kernel.dhcp import LeaseCache
    from ..kernel.dns import Forwarder
    from ..kernel.fairshare import FairShare
    from ..kernel.scitags import FireflyReporter

log = logging.getLogger(__name__)
# A record's job_pid for a network larkd built in a namespace of its own making, for a job's file-transfer plugins
# before the job has a namespace (lark/daemon/transfer_plugin.py); no process has pid 0.
TRANSFER_NETNS = 0


class Host(Protocol):
    """What the resources use of the JobNetworker (this EP's shared parts)."""
    cfg: Config
    sections: JobSections               # what the kernel functions get (lark/kernel/sections.py)
    fw: Firewall
    acct: Accountant
    records: RecordStore
    leases: LeaseCache
    dns: Forwarder
    fair: FairShare
    controller: ControllerClient
    ports: LockPool
    kernel: KernelOps                   # every kernel call below goes through it (lark/kernel/ops.py)

    @property
    def modes(self) -> dict: ...
    @property
    def profiles(self) -> dict[str, Profile]: ...
    @property
    def pools(self) -> list[LockPool]: ...
    @property
    def fireflies(self) -> FireflyReporter | None: ...
    def netns_path(self, key: str) -> str: ...
    def fair_rebalance(self, ipr: Any, new: JobNetwork) -> JobNetwork: ...


@dataclass
class JobCtx:
    """One job's setup or teardown in progress: its names, record, the network as built so far, open handles."""
    key: str
    names: JobNames
    rec: JobRecord | None
    profile: Profile | None
    net: JobNetwork | None = None
    ipr: Any = None                     # netlink in the host's netns
    ns_fd: int = -1                     # the job's netns, open while setting up
    nipr: Any = None                    # netlink in the job's netns
    host_idx: int = -1                  # the veth's ends, once they exist
    job_idx: int = -1
    stack: contextlib.ExitStack = field(default_factory=contextlib.ExitStack)  # closes the handles above
    save: Callable[[], None] = lambda: None  # setup: saves the record now, if changed (the engine's saver)
    link: dict | None = None            # teardown: the veth's counters, read before it goes
    summary: dict | None = None         # teardown: the accounting's final figures

    @property
    def job_id(self) -> str:
        return self.rec.job_id if self.rec else self.key

    def set_net(self, net: JobNetwork) -> None:
        """The network as built so far; the record follows (the engine saves it after the step)."""
        self.net = net
        if self.rec is not None:
            self.rec.plan = net.to_dict()

    def recorded_profile(self, host: Host) -> Profile | None:
        """Teardown: the profile the record names (None for an orphan without a record, or a mode gone)."""
        if self.rec is None:
            return None
        return host.profiles.get(self.rec.plan.get("network_type", ""))


@dataclass
class CheckCtx:
    """`lark status --verify` of one ready job (read-only): its record and the handles the checks share; the
    veth's check fills in the indexes (None: that end is gone)."""
    key: str
    names: JobNames
    rec: JobRecord
    job: JobNetwork
    profile: Profile | None             # None: this larkd no longer offers the job's network type
    ipr: Any
    nipr: Any = None                    # None: the job's netns could not be opened by its name
    ns_fd: int | None = None
    host_idx: int | None = None
    job_idx: int | None = None


class Base:
    name = "abstract"
    phase = Phase.NETNS

    def __init__(self, host: Host):
        self.host = host

    def add(self, ctx: JobCtx) -> None:
        raise NotImplementedError

    def remove(self, ctx: JobCtx, errors: TeardownErrors) -> None:
        """Nothing of its own to remove (it goes with the netns or the veth: see the class)."""

    def keys(self) -> Iterable[tuple[str, str]]:
        return ()

    def check(self, ctx: CheckCtx) -> list[Finding]:
        """Is it there as recorded (read-only)? Nothing to check of its own by default."""
        return []


class Netns(Base):
    """The job's network namespace, named and pinned under netns_dir; opened for the rest of setup."""
    name, phase = "netns", Phase.NETNS

    def add(self, ctx: JobCtx) -> None:
        assert ctx.rec is not None
        path = self.host.netns_path(ctx.key)
        if ctx.rec.job_pid == TRANSFER_NETNS:    # larkd made it (JobNetworker.setup): check it is still that one
            if not self.host.kernel.is_mounted_netns(path) or os.stat(path).st_ino != ctx.rec.netns_inode:
                raise LarkError("the namespace made for the job's file transfers is gone", job=ctx.job_id,
                                obj=path, fix="retry the job; lark gc removes what is left")
        else:
            self.host.kernel.attach_netns(ctx.rec.job_pid, path, expect_inode=ctx.rec.netns_inode)
        fd = os.open(path, os.O_RDONLY)
        ctx.stack.callback(os.close, fd)
        ctx.ns_fd = fd

    def remove(self, ctx: JobCtx, errors: TeardownErrors) -> None:
        errors.run(f"remove netns {ctx.names.netns}", self.host.kernel.detach_netns, self.host.netns_path(ctx.key))

    def keys(self) -> Iterable[tuple[str, str]]:
        cfg = self.host.cfg
        return [(name[len(cfg.netns_prefix):], f"netns {name}")
                for name in self.host.kernel.list_netns(cfg.netns_dir, cfg.netns_prefix)]


class HostPrepare(Base):
    """The mode's shared host objects (a bridge...) and, for a Linux bridge, the firewall's bridge table: per host,
    not per job, so nothing to remove."""
    name = "host-prepare"

    def add(self, ctx: JobCtx) -> None:
        assert ctx.profile is not None and ctx.profile.mode is not None
        ctx.profile.mode.ensure_prepared(ctx.ipr)
        if ctx.profile.bridge_table:
            self.host.fw.ensure_bridge_base()  # the port is filtered from the moment it joins


class Reservations(Base):
    """Static addresses and the inbound port from the pools (IPv6 from the site: its netns prepared for it)."""
    name, phase = "reservations", Phase.POOLS

    def add(self, ctx: JobCtx) -> None:
        assert ctx.net is not None and ctx.profile is not None and ctx.profile.mode is not None
        plan, prof, mode, cfg = ctx.net.plan, ctx.profile, ctx.profile.mode, self.host.cfg
        got: dict = {}
        if plan.wants_ipv4 and not prof.dhcp4(plan):
            got.update(ipv4=mode.pool.reserve(plan.key, plan.job_id), gateway4=mode.gateway, ipv4_prefix=mode.prefix)
        if prof.slaac(plan, cfg) or prof.dhcpv6(plan, cfg):
            # The address comes from the site's router or DHCPv6 server (the address resource).
            self.host.kernel.prepare_ipv6_auto(ctx.ns_fd, autoconf=prof.slaac(plan, cfg))
        elif plan.wants_ipv6:
            assert mode.pool6 is not None, "check_feasible refuses IPv6 jobs of modes without an IPv6 source"
            got.update(ipv6=mode.pool6.reserve(plan.key, plan.job_id), gateway6=mode.gateway6,
                       ipv6_prefix=mode.prefix6)
            # Before the job's device exists, so it inherits it: no DAD delay on its addresses.
            self.host.kernel.write_sysctl_in(ctx.ns_fd, "net.ipv6.conf.default.accept_dad", "0")
        if plan.inbound and not prof.bridged:
            got["inbound_port"] = int(self.host.ports.reserve(plan.key, plan.job_id))
        ctx.set_net(ctx.net.with_addresses(**got))

    def remove(self, ctx: JobCtx, errors: TeardownErrors) -> None:
        for pool in self.host.pools:
            errors.run(f"release the {pool.what}", pool.release, ctx.key)

    def keys(self) -> Iterable[tuple[str, str]]:
        return [(owner, f"{pool.what} lock {item}") for pool in self.host.pools for item, owner in pool.entries()]


class Veth(Base):
    """The job's veth pair: host end in the host, job end in the job's netns (with the job's MAC when bridged)."""
    name, phase = "veth", Phase.UNLINK

    def add(self, ctx: JobCtx) -> None:
        assert ctx.net is not None and ctx.profile is not None and ctx.profile.mode is not None
        plan, n = ctx.net.plan, ctx.names
        kernel = self.host.kernel
        made = kernel.create_veth(ctx.ipr, n.host_if, n.job_if, ctx.ns_fd, plan.job_id,
                                  n.job_mac if ctx.profile.bridged else None,
                                  kernel.job_mtu(ctx.ipr, self.host.sections.mtu, ctx.profile.mode))
        # The kernel's echo of the create request gave the indexes (links.py); else look the host end up.
        ctx.host_idx = made.host if made is not None else ctx.ipr.link_lookup(ifname=n.host_if)[0]

    def remove(self, ctx: JobCtx, errors: TeardownErrors) -> None:
        errors.run(f"delete {ctx.names.host_if}", self.host.kernel.delete_link, ctx.ipr, ctx.names.host_if)

    def check(self, ctx: CheckCtx) -> list[Finding]:
        found, ctx.host_idx, ctx.job_idx = self.host.kernel.verify_veth(ctx.ipr, ctx.names.host_if, ctx.nipr,
                                                                        ctx.names.job_if)
        return found

    def keys(self) -> Iterable[tuple[str, str]]:
        with self.host.kernel.host_netlink() as ipr:
            names = self.host.kernel.list_links(ipr, HOST_IF_PREFIX)
        return [(k, f"link {ifname}") for ifname in names if (k := key_from_host_if(ifname))]


class Attach(Base):
    """The host end joined to the mode's network (a route, a bridge port, an OVS port and its flows). Removed
    together with what the mode-filter step added: AttachMode.detach undoes both."""
    name, phase = "attach", Phase.UNLINK

    def add(self, ctx: JobCtx) -> None:
        assert ctx.net is not None and ctx.profile is not None and ctx.profile.mode is not None
        ctx.profile.mode.attach(ctx.ipr, ctx.host_idx, ctx.net, ctx.names)  # before DHCP: bridged, the server
        # is behind the bridge

    def remove(self, ctx: JobCtx, errors: TeardownErrors) -> None:
        prof = ctx.recorded_profile(self.host)
        # A record names the job's mode; an orphan found by gc may be in any of them.
        if prof is not None and prof.mode is not None:
            holders = [prof.mode]
        else:
            holders = [m for m in self.host.modes.values()
                       if ctx.key in (errors.run(f"list {m.name} ports", m.job_keys) or ())]
        for m in holders:
            errors.run(f"detach from {m.name}", m.detach, ctx.names)

    def keys(self) -> Iterable[tuple[str, str]]:
        return [(k, f"{m.name} port") for m in self.host.modes.values() for k in m.job_keys()]

    def check(self, ctx: CheckCtx) -> list[Finding]:
        if ctx.profile is None or ctx.profile.mode is None:
            return [drifted(f"network type {ctx.job.network_type}", "this larkd's configuration no longer offers it",
                            "the configuration changed under a running job; nothing else was checked for it")]
        if ctx.host_idx is None:
            return []  # the veth's check reported it gone
        return ctx.profile.mode.verify(ctx.ipr, ctx.host_idx, ctx.job, ctx.names)


class JobSide(Base):
    """The job's end (or, without a network, lo) up; one netlink socket in the job's netns for the steps after
    (each costs ~1 ms). Bridged: waits until the mode switches the job's first frame (else it is dropped)."""
    name = "job-side"

    def add(self, ctx: JobCtx) -> None:
        ctx.nipr = ctx.stack.enter_context(self.host.kernel.netlink_in(ctx.ns_fd))
        if ctx.profile is None or ctx.profile.mode is None:
            self.host.kernel.bring_up_job_side(ctx.nipr, None)
            return
        assert ctx.net is not None
        ctx.job_idx = self.host.kernel.bring_up_job_side(ctx.nipr, ctx.names.job_if)
        ctx.profile.mode.wait_forwarding(ctx.ipr, ctx.host_idx, ctx.net.plan.job_id)


class DhcpLease(Base):
    """IPv4 from the site's DHCP server (bridged jobs that ask for it): the slot's fresh cached lease or a new one;
    recorded at once so teardown releases it."""
    name, phase = "dhcp-lease", Phase.RELEASE

    def add(self, ctx: JobCtx) -> None:
        assert ctx.net is not None and ctx.profile is not None and ctx.profile.mode is not None
        plan = ctx.net.plan
        if not ctx.profile.dhcp4(plan):
            return
        lease = self._lease(ctx)
        ctx.set_net(ctx.net.with_addresses(ipv4=lease.address, ipv4_prefix=lease.prefix,
                                           gateway4=lease.router or ctx.profile.mode.gateway, dhcp=lease.to_dict()))

    def _lease(self, ctx: JobCtx) -> Lease:
        assert ctx.net is not None
        plan, n = ctx.net.plan, ctx.names
        cached = self.host.leases.get(plan.key, plan.owner)  # never another owner's lease (nor its address)
        if cached is not None and cached.usable():
            log.info("job %s reuses the slot's DHCP lease %s (server %s)", plan.job_id, cached.address, cached.server)
            return cached
        with self.host.kernel.entered(ctx.ns_fd):
            lease = self.host.kernel.dhcp_acquire(n.job_if, n.job_mac, plan.job_id, owner=plan.owner)
        self.host.leases.put(plan.key, lease)
        log.info("job %s got DHCP lease %s/%d from %s for %d s", plan.job_id, lease.address, lease.prefix,
                 lease.server, lease.lease_time)
        return lease

    def remove(self, ctx: JobCtx, errors: TeardownErrors) -> None:
        errors.run("release the DHCP lease", self._release, ctx)

    def _release(self, ctx: JobCtx) -> None:
        rec = ctx.rec
        if not (rec and rec.lease and self.host.cfg.dhcp_release):
            return
        lease = Lease.from_dict(rec.lease)
        try:
            fd = os.open(self.host.netns_path(ctx.key), os.O_RDONLY)
            try:
                with self.host.kernel.entered(fd):
                    self.host.kernel.dhcp_release(ctx.names.job_if, ctx.names.job_mac, rec.job_id, lease)
            finally:
                os.close(fd)
        except OSError as e:
            log.warning("could not release DHCP lease %s of job %s: %s", lease.address, rec.job_id, e)
        self.host.leases.drop(ctx.key, lease.owner)


class Address(Base):
    """The job's addresses and default routes on its device: static (from the pools or the lease), or IPv6 from
    the site's router (SLAAC, waited for) or DHCPv6 server (a dhcpcd client in the job's netns, stopped on
    teardown before the netns goes)."""
    name, phase = "address", Phase.DRAIN

    def add(self, ctx: JobCtx) -> None:
        assert ctx.net is not None and ctx.profile is not None
        net, cfg, nipr, idx = ctx.net, self.host.cfg, ctx.nipr, ctx.job_idx
        if net.addrs.ipv4:
            self.host.kernel.add_job_address(nipr, idx, net.addrs.ipv4, net.addrs.ipv4_prefix, net.addrs.gateway4)
        if net.addrs.ipv6:
            self.host.kernel.add_job_address6(nipr, idx, net.addrs.ipv6, net.addrs.ipv6_prefix, net.addrs.gateway6)
        elif ctx.profile.slaac(net.plan, cfg):
            ipv6, prefix = self.host.kernel.wait_for_slaac(nipr, idx, net.plan.job_id, cfg.slaac_timeout)
            ctx.set_net(net.with_addresses(ipv6=ipv6, ipv6_prefix=prefix))
        elif ctx.profile.dhcpv6(net.plan, cfg):
            ipv6, prefix = self.host.kernel.dhcpv6_acquire(self.host.sections.dhcp6, net.plan.key,
                                                           self.host.netns_path(net.plan.key), ctx.names.job_if,
                                                           nipr, idx, net.plan.job_id, cfg.dhcpv6_timeout)
            ctx.set_net(net.with_addresses(ipv6=ipv6, ipv6_prefix=prefix))

    def remove(self, ctx: JobCtx, errors: TeardownErrors) -> None:
        errors.run("stop the DHCPv6 client", self.host.kernel.dhcpv6_stop, self.host.sections.dhcp6, ctx.key)

    def check(self, ctx: CheckCtx) -> list[Finding]:
        if ctx.nipr is None or ctx.job_idx is None:
            return []
        job, found = ctx.job, []
        for address, prefix, gateway in ((job.ipv4, job.ipv4_prefix, job.gateway4),
                                         (job.ipv6, job.ipv6_prefix, job.gateway6)):
            if address:
                found += self.host.kernel.verify_job_address(ctx.nipr, ctx.job_idx, ctx.names.job_if, address,
                                                             prefix, gateway)
        return found

    def keys(self) -> Iterable[tuple[str, str]]:
        # A client in a job's netns keeps it alive after its name is gone; its directory names the job.
        return [(k, "DHCPv6 client") for k in self.host.kernel.dhcpv6_keys(self.host.sections.dhcp6)]


class DnsSteering(Base):
    """The job's DNS to this host's forwarder (IPv6: through a relay in the job's netns, stopped on teardown
    before the netns goes)."""
    name, phase = "dns", Phase.DRAIN

    def add(self, ctx: JobCtx) -> None:
        assert ctx.net is not None and ctx.profile is not None and ctx.profile.mode is not None
        plan = ctx.net.plan
        self.host.kernel.setup_dns(self.host.dns, ctx.ipr, ctx.profile.mode.host_device, ctx.net.ipv4, ctx.ns_fd,
                                   self.host.netns_path(plan.key), ctx.names.job_if, ctx.job_idx, plan.job_id)

    def remove(self, ctx: JobCtx, errors: TeardownErrors) -> None:
        errors.run("stop the IPv6 DNS relay", self.host.kernel.stop_dns6_relay, self.host.sections.dns,
                   self.host.netns_path(ctx.key))

    def keys(self) -> Iterable[tuple[str, str]]:
        return [(k, "IPv6 DNS relay") for k in self.host.kernel.dns6_relay_keys(self.host.sections.dns)]


class Shaping(Base):
    """The job's rate limit (tc on both veth ends; goes with the veth). Fair-share jobs get their share here, and
    the running unreserved jobs move to theirs, one job at a time; teardown's rebalance is jobnet's, after the
    record is gone."""
    name = "shaping"

    def add(self, ctx: JobCtx) -> None:
        assert ctx.net is not None and ctx.rec is not None
        with self.host.fair.lock:  # the limits on the link change one job at a time
            net = self.host.fair_rebalance(ctx.ipr, ctx.net)
            ctx.set_net(net)
            if net.rate_limit_mbit:
                limit = shaping.limit_for(net.rate_limit_mbit, net.plan.job_id)
                self.host.kernel.apply_shaping(ctx.ipr, ctx.host_idx, ctx.nipr, ctx.job_idx, limit, net.plan.job_id)
                ctx.rec.shaped = True
                ctx.save()  # inside the lock: a rebalance reads the records

    def check(self, ctx: CheckCtx) -> list[Finding]:
        with self.host.fair.lock:   # a fair-share rebalance moves limits and records together
            mbit = ctx.rec.rate_limit_mbit
            if not mbit:
                return []
            return self.host.kernel.verify_shaping(ctx.ipr, ctx.host_idx, ctx.names.host_if, ctx.nipr, ctx.job_idx,
                                                   ctx.names.job_if, shaping.limit_for(mbit, ctx.rec.job_id))


class ModeFilter(Base):
    """Per-job filtering the mode does itself once the address is known (after DHCP); the attach step's remove
    (AttachMode.detach) takes it away."""
    name = "mode-filter"

    def add(self, ctx: JobCtx) -> None:
        assert ctx.net is not None and ctx.profile is not None and ctx.profile.mode is not None
        ctx.profile.mode.secure(ctx.net, ctx.names)


class JobNetnsFilter(Base):
    """In the job's own netns, where the job has no CAP_NET_ADMIN to change it: the DHCP guard (only larkd's DHCP
    messages leave), and the stateful "no new inbound" filter (bridged frames have no conntrack on every kernel,
    and a NAT job's connections from the EP host itself are local output that the forward hook never sees).
    Goes with the netns."""
    name = "job-netns-filter"

    def add(self, ctx: JobCtx) -> None:
        assert ctx.net is not None and ctx.profile is not None
        plan = ctx.net.plan
        self.host.kernel.secure_job_netns(ctx.ns_fd, plan.job_id, block_inbound=not plan.inbound,
                                          dhcpv6_client=ctx.profile.dhcpv6(plan, self.host.cfg))

    def check(self, ctx: CheckCtx) -> list[Finding]:
        if ctx.ns_fd is None or ctx.profile is None:
            return []
        return self.host.kernel.verify_job_netns(ctx.ns_fd, block_inbound=not ctx.job.inbound,
                                                 dhcpv6_client=ctx.profile.dhcpv6(ctx.job.plan, self.host.cfg))


class SciTags(Base):
    """The SciTags tag bits in the job's netns (after anything the job chose; go with the netns) and, with a
    collector, the firefly reporter watching its flows: finished before the netns goes (its end fireflies come
    from the netns' conntrack table)."""
    name, phase = "scitags", Phase.DRAIN

    def add(self, ctx: JobCtx) -> None:
        assert ctx.net is not None
        plan, fireflies = ctx.net.plan, self.host.fireflies
        if not plan.scitag:
            return
        self.host.kernel.scitags_secure(ctx.ns_fd, plan.job_id, plan.scitag, fireflies=fireflies is not None)
        if fireflies is not None:
            fireflies.watch(plan.key, plan.job_id, ctx.ns_fd, plan.scitag,
                            {a for a in (ctx.net.ipv4, ctx.net.ipv6) if a})

    def remove(self, ctx: JobCtx, errors: TeardownErrors) -> None:
        fireflies = self.host.fireflies
        if fireflies is not None:
            errors.run("send the SciTags end fireflies", fireflies.finish, ctx.key)

    def check(self, ctx: CheckCtx) -> list[Finding]:
        if ctx.ns_fd is None or ctx.profile is None or not ctx.job.plan.scitag:
            return []
        return self.host.kernel.scitags_verify(ctx.ns_fd, ctx.job.plan.scitag,
                                               fireflies=bool(self.host.cfg.scitags_collector))


_UNLABELLED_WARNED: set[str] = set()   # network types whose jobs got a label this larkd cannot apply (logged once)


class ControllerRegistration(Base):
    """The job at the pool controller, before the answer to the wrapper: the pool switch has the job's flows
    before its program runs. A policy that drops its traffic also revokes its DNS (the forwarder on this host is
    before the switch: name lookups would be its tunnel out)."""
    name, phase = "controller", Phase.UNREGISTER

    def add(self, ctx: JobCtx) -> None:
        assert ctx.net is not None and ctx.profile is not None
        net = ctx.net
        decision = self.host.controller.register(net, ctx.names.job_mac if ctx.profile.bridged else "")
        label = decision.get("label")
        if label:   # [labels] mode = "vlan" at the controller: the EP's switch tags the job's frames (issue 26)
            apply = getattr(ctx.profile.mode, "apply_label", None)
            if apply is not None:
                if not apply(net, ctx.names, int(label["vid"]), int(label["pcp"])):
                    # Untagged, its frames would pass a label-scheme core as host traffic, outside the
                    # controller's policy (a job can ask for a RequestedVLAN port): refused, not run unlabelled.
                    raise LarkError("the pool controller's label cannot be applied to this job's port",
                                    job=net.plan.job_id, obj=f"OVS port {ctx.names.host_if}",
                                    fix="drop RequestedVLAN from the job, or set LARK_OVS_UPLINK; see "
                                        "docs/controller.md (label scheme)")
            elif ctx.profile.network_type not in _UNLABELLED_WARNED:
                _UNLABELLED_WARNED.add(ctx.profile.network_type)
                log.warning("job %s: the pool controller gave it a label (VLAN %s, PCP %s), which only OVS mode "
                            "applies: %s jobs leave this EP untagged (and without the controller's policies at a "
                            "label-scheme core); use OVS mode, or [labels] mode = \"off\" at the controller",
                            net.plan.job_id, label["vid"], label["pcp"], ctx.profile.network_type)
        if decision.get("blocked_by") or decision.get("wan_drop"):
            ctx.set_net(net.with_addresses(dns_revoked_by=decision.get("blocked_by") or decision["wan_policy"]))
            log.info("job %s: no DNS, as the pool controller's policy %s drops its %s", net.plan.job_id,
                     ctx.net.dns_revoked_by, "traffic" if decision.get("blocked_by") else "WAN traffic")

    def remove(self, ctx: JobCtx, errors: TeardownErrors) -> None:
        if ctx.rec:
            errors.run("unregister from the controller", self.host.controller.unregister, ctx.key, ctx.rec.job_id)


class FirewallAndAccounting(Base):
    """The job's host firewall rules and the accounting of its traffic: one resource, as the final figures are
    the counters the rules' removal reads (or, for modes counted by link, the veth's counters, read first)."""
    name, phase = "firewall", Phase.COUNT

    def add(self, ctx: JobCtx) -> None:
        assert ctx.net is not None and ctx.rec is not None and ctx.profile is not None
        self.host.fw.add_job(ctx.net, ctx.names, ctx.profile.firewall_rules)
        self.host.acct.start(ctx.key, ctx.rec.created, ctx.names.host_if if ctx.profile.counts_by_link else None)

    def remove(self, ctx: JobCtx, errors: TeardownErrors) -> None:
        n, fw = ctx.names, self.host.fw
        link = ctx.link = errors.run("read the veth counters", self.host.kernel.link_stats, ctx.ipr, n.host_if)
        reading = errors.run(f"remove the {fw.name} rules", fw.remove_job, n)
        prof = ctx.recorded_profile(self.host)
        if prof is not None and prof.counts_by_link and link:
            reading = link_reading(link)
        summary = errors.run("close the accounting", self.host.acct.final, ctx.key, reading,
                             ctx.rec.created if ctx.rec else None)
        if summary is not None and link:
            # The device's own view, for cross-checking the netfilter counters: host-side tx = toward the job.
            summary["link_bytes_in"] = link["tx_bytes"]
            summary["link_packets_in"] = link["tx_packets"]
            summary["link_bytes_out"] = link["rx_bytes"]
            summary["link_packets_out"] = link["rx_packets"]
        ctx.summary = summary

    def keys(self) -> Iterable[tuple[str, str]]:
        # The other backends' leftovers are sweep's (they are no job's resource under this configuration).
        return [(k, f"{self.host.fw.name} rules") for k in fw_job_keys(self.host.fw)]

    def check(self, ctx: CheckCtx) -> list[Finding]:
        if ctx.profile is None or ctx.profile.mode is None:
            return []  # the attach step's check reported the network type this larkd no longer offers
        return self.host.fw.verify_job(ctx.job, ctx.names, ctx.profile.firewall_rules)


def fw_job_keys(fw: Firewall) -> set[str]:
    try:
        return fw.job_keys()
    except LarkError as e:  # e.g. the other backend's tools are not installed: it cannot hold anything
        log.debug("no %s job objects to look at: %s", fw.name, e)
        return set()


def resources(host: Host) -> list[Base]:
    """Every resource, in setup order (profiles.py picks a job's; teardown order: engine.Phase)."""
    return [Netns(host), HostPrepare(host), Reservations(host), Veth(host), Attach(host), JobSide(host),
            DhcpLease(host), Address(host), DnsSteering(host), Shaping(host), ModeFilter(host),
            JobNetnsFilter(host), SciTags(host), ControllerRegistration(host), FirewallAndAccounting(host)]
