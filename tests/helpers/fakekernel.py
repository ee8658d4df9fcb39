"""An in-memory kernel for unit tests of the orchestration (jobnet, sweep, daemon dispatch).

The way Kubernetes tests its nftables code against a fake: every kernel call that jobnet makes (the operations of
lark/kernel/ops.py's KernelOps, the attach mode and the firewall driver) changes a set of named objects here
instead of the kernel, and any step can be told to fail. All three are given to the JobNetworker (injection, no
patching of lark's modules). That includes what bridged jobs reach outside the host: the site's DHCP server (its
leases are objects "dhcp-lease"), the DHCPv6 client and the IPv6 DNS relay in the job's netns (processes: objects
"dhcpv6-client", "dns6-relay"), SLAAC, SciTags and the firefly reporter ("fireflies"), and the fair-share limits.
Each resource's add is followed by a step "<resource>.added", so a failure can be injected after any resource
did its work (a resource that fails mid-setup). The address pools, records and the DHCP lease cache stay real
(files in a temp dir), so a test also sees whether addresses were given back.
"""
from __future__ import annotations

import contextlib
import dataclasses
import itertools
import os
import time
from types import SimpleNamespace
from typing import Any

from lark.config import Config
from lark.daemon.engine import Engine, TeardownErrors
from lark.daemon.jobnet import JobNetworker
from lark.daemon.records import FinishedStore, RecordStore
from lark.kernel.accounting import Accountant
from lark.kernel.attach.base import AttachMode, BridgedMode
from lark.kernel.attach.bridge import BridgeMode
from lark.kernel.attach.nat import NatMode
from lark.kernel.attach.ovs import OvsMode
from lark.kernel.dhcp import Lease
from lark.kernel.drift import Finding, drifted, present
from lark.kernel.fairshare import FairShare, LinkJob
from lark.kernel.firewall.base import Counters, Firewall
from lark.kernel.ops import KernelOps
from lark.kernel.sections import FirewallSection
from lark.names import JobNames


class KernelFailure(OSError):
    """What a failing fake step raises (kernel calls fail with OSError or pyroute2's NetlinkError)."""


class FakeKernel:
    def __init__(self) -> None:
        self.objects: set[tuple[str, str]] = set()   # (kind, name): ("netns", "lark-slot1"), ("link", "lk-slot1")
        self.fail: set[str] = set()                  # names of steps that raise
        self.calls: list[str] = []
        # The host's resolv.conf has ::1 as well as 127.0.0.53: each job with IPv4 gets an IPv6 DNS relay (a
        # process in its netns, object "dns6-relay"); off by default (127.0.0.53 only: no relay).
        self.loopback_ns6 = False

    def step(self, name: str) -> None:
        self.calls.append(name)
        if name in self.fail:
            raise KernelFailure(f"injected failure of {name}")

    def of_key(self, key: str) -> set[tuple[str, str]]:
        return {o for o in self.objects if o[1].endswith(key)}


class FakeFirewall(Firewall):
    """A driver whose rules are objects ("fw:<name>", key) in the fake kernel."""

    def __init__(self, cfg: Config, kernel: FakeKernel, name: str = "nftables"):
        super().__init__(FirewallSection.from_config(cfg))
        self.k = kernel
        self.name = name

    def ensure_base(self) -> None:
        self.k.objects.add((f"fw:{self.name}", "base"))

    def destroy_base(self) -> None:
        self.k.step(f"{self.name}.destroy_base")
        self.k.objects.discard((f"fw:{self.name}", "base"))

    def add_job(self, plan, names: JobNames, rules: str) -> None:
        self.k.step(f"{self.name}.add_job")
        self.k.objects.add((f"fw:{self.name}", names.key))

    def remove_job(self, names: JobNames) -> Counters | None:
        self.k.step(f"{self.name}.remove_job")
        if (f"fw:{self.name}", names.key) not in self.k.objects:
            return None
        self.k.objects.discard((f"fw:{self.name}", names.key))
        return Counters(bytes_in=1000, bytes_out=500, packets_in=10, packets_out=5)

    def read_counters(self) -> dict[str, Counters]:
        return {}

    def verify_job(self, plan, names: JobNames, rules: str) -> list[Finding]:
        self.k.step(f"{self.name}.verify_job")
        what = f"{self.name} rules of {names.host_if}"
        return [present(what) if (f"fw:{self.name}", names.key) in self.k.objects else drifted(what, "gone", "fw")]

    def job_keys(self) -> set[str]:
        return {name for kind, name in self.k.objects if kind == f"fw:{self.name}" and name != "base"}

    def base_present(self) -> bool:
        return (f"fw:{self.name}", "base") in self.k.objects


class FakeAttach(AttachMode):
    """The kernel (or switch) work of an attach mode, on the fake kernel: its shared object ("<mode>-shared"),
    each job's port or route (kind "<mode>") and the mode's own filter ("<mode>-filter"). Mixed in before a real
    mode, so addressing (pools, gateway, prefix) and the traits (bridged, counts_by_link) stay the mode's own."""

    k: FakeKernel

    kind = "port"        # the fake kernel's kind of this mode's per-job object
    step_prefix = "port"  # injected failures name the step "<prefix>.attach", ...
    makes_shared = True   # prepare() makes a shared host object (a bridge); NAT's makes none
    filters = True        # secure() adds per-job filtering of the mode's own (bridge rules, OVS flows)

    def prepare(self, ipr) -> None:
        if self.makes_shared:
            self.k.step(f"{self.step_prefix}.prepare")
            self.k.objects.add((f"{self.name}-shared", "host"))

    def attach(self, ipr, host_idx: int, plan, names: JobNames) -> None:
        self.k.step(f"{self.step_prefix}.attach")
        self.k.objects.add((self.kind, f"{plan.ipv4}/{names.key}"))

    def wait_forwarding(self, ipr, host_idx: int, job: str) -> None:
        self.k.step(f"{self.step_prefix}.wait_forwarding")

    def secure(self, plan, names: JobNames) -> None:
        if self.filters:
            self.k.step(f"{self.step_prefix}.secure")
            self.k.objects.add((f"{self.name}-filter", names.key))

    def detach(self, names: JobNames) -> bool:
        self.k.step(f"{self.step_prefix}.detach")
        gone = {o for o in self.k.objects
                if (o[0] == self.kind and o[1].endswith("/" + names.key)) or o == (f"{self.name}-filter", names.key)}
        self.k.objects -= gone
        return bool(gone)

    def job_keys(self) -> set[str]:
        return ({name.rpartition("/")[2] for kind, name in self.k.objects if kind == self.kind}
                | {name for kind, name in self.k.objects if kind == f"{self.name}-filter"})

    def verify(self, ipr, host_idx: int, plan, names: JobNames) -> list[Finding]:
        what = f"{self.kind} {plan.ipv4}"
        there = (self.kind, f"{plan.ipv4}/{names.key}") in self.k.objects
        return [present(what) if there else drifted(what, "gone", self.kind)]


class FakeMode(FakeAttach, NatMode):
    """NAT mode's addressing (real pools); its kernel work (the job's route) goes to the fake kernel."""
    kind, step_prefix, makes_shared, filters = "route", "mode", False, False

    def __init__(self, cfg: Config, kernel: FakeKernel):
        NatMode.__init__(self, self.section.from_config(cfg))
        self.k = kernel


class FakeBridgeMode(FakeAttach, BridgeMode):
    """Linux-bridge mode: a station on the site network (bridge_range), its port and filter on the fake kernel."""
    kind, step_prefix = "bridge-port", "bridge"

    def __init__(self, cfg: Config, kernel: FakeKernel):
        BridgeMode.__init__(self, self.section.from_config(cfg))
        self.k = kernel


class FakeOvsMode(FakeAttach, OvsMode):
    """OVS mode (counted by link): its port and flows on the fake kernel. OvsMode's own __init__ would reach for
    an OVSDB; only BridgedMode's (the address pools) runs."""
    kind, step_prefix = "ovs-port", "ovs"

    def __init__(self, cfg: Config, kernel: FakeKernel):
        BridgedMode.__init__(self, self.section.from_config(cfg))  # OvsSection
        self.k = kernel


FAKE_MODES: dict[str, type] = {"nat": FakeMode, "bridge": FakeBridgeMode, "ovs_bridge": FakeOvsMode}
# The site network of the bridged fakes (documentation addresses, RFC 5737).
BRIDGED_CONFIG = {"bridge_range": "192.0.2.10-192.0.2.12", "bridge_gateway": "192.0.2.1", "bridge_prefix": 24}


class FakeFireflies:
    """The SciTags firefly reporter: a job's watch is an object ("fireflies", key) until its end fireflies go."""

    def __init__(self, kernel: FakeKernel, collector: tuple[str, int]):
        self.k = kernel
        self.collector = collector

    def watch(self, key: str, job_id: str, ns_fd: int, scitag: int, addresses: set[str]) -> None:
        self.k.step("fireflies.watch")
        self.k.objects.add(("fireflies", key))

    def finish(self, key: str) -> int:
        self.k.step("fireflies.finish")
        found = ("fireflies", key) in self.k.objects
        self.k.objects.discard(("fireflies", key))
        return 2 if found else 0   # a start and an end firefly

    def close(self) -> None:
        return None


class FakeFairShare(FairShare):
    """The real share arithmetic and lock; moving a running job's limit is a step on the fake kernel."""

    def __init__(self, floor_mbit: float, kernel: FakeKernel):
        super().__init__(floor_mbit)
        self.k = kernel
        self.moved: list[tuple[str, float]] = []

    def _change(self, ipr: Any, job: LinkJob, mbit: float) -> None:  # type: ignore[override]
        self.k.step("fairshare.change")
        self.moved.append((job.key, mbit))


class StepAfterAdd:
    """A resource of the real list whose add, once done, is followed by the fake kernel's step "<name>.added"
    (so a test can fail a setup right after any resource made its part); everything else is the resource's own."""

    def __init__(self, inner: Any, kernel: FakeKernel):
        self.inner = inner
        self.k = kernel
        self.name = inner.name
        self.phase = inner.phase

    def add(self, ctx: Any) -> None:
        self.inner.add(ctx)
        self.k.step(f"{self.name}.added")

    def remove(self, ctx: Any, errors: TeardownErrors) -> None:
        self.inner.remove(ctx, errors)

    def keys(self):
        return self.inner.keys()

    def check(self, ctx: Any) -> list[Finding]:
        return self.inner.check(ctx)


class FakeNetlink:
    """A netlink socket on the fake kernel: a context manager whose host end of every veth has index 7."""

    def __enter__(self) -> FakeNetlink:
        return self

    def __exit__(self, *exc) -> None:
        return None

    def close(self) -> None:
        return None

    def link_lookup(self, ifname: str) -> list[int]:
        return [7]


def fake_kernel_ops(k: FakeKernel) -> KernelOps:
    """Every operation of lark/kernel/ops.py's KernelOps on the fake kernel (what JobNetworker is given)."""
    def attach(pid: int, path: str, expect_inode: int | None = None) -> None:
        k.step("netns.attach")
        open(path, "w").close()  # jobnet opens the name; a plain file serves for the fake
        k.objects.add(("netns", os.path.basename(path)))

    def create(path: str) -> int:
        k.step("netns.create")
        open(path, "w").close()
        k.objects.add(("netns", os.path.basename(path)))
        return os.stat(path).st_ino

    def detach(path: str) -> bool:
        k.step("netns.detach")
        found = ("netns", os.path.basename(path)) in k.objects
        k.objects.discard(("netns", os.path.basename(path)))
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        return found

    @contextlib.contextmanager
    def netlink_in(ns_fd: int):
        yield SimpleNamespace()

    @contextlib.contextmanager
    def entered(ns_fd: int):
        yield

    def list_named(netns_dir: str, prefix: str) -> list[str]:
        return sorted(n for kind, n in k.objects if kind == "netns" and n.startswith(prefix))

    def verify_named(path: str, inode: int) -> Finding:
        what = f"netns {os.path.basename(path)}"
        return present(what) if ("netns", os.path.basename(path)) in k.objects else drifted(what, "gone", "netns")

    host_if_of_mac: dict[str, str] = {}   # the DHCP server knows a client by its MAC
    served = itertools.count(50)          # the fake DHCP server's next address: 198.51.100.50, .51...

    def create_veth(ipr, host_if, job_if, ns_fd, job, job_mac=None, mtu=None) -> None:
        k.step("links.create_veth")
        k.objects.add(("link", host_if))
        if job_mac:
            host_if_of_mac[job_mac] = host_if

    def delete_link(ipr, ifname) -> bool:
        k.step("links.delete_link")
        found = ("link", ifname) in k.objects
        k.objects.discard(("link", ifname))
        return found

    def link_stats(ipr, ifname):
        k.step("links.link_stats")
        if ("link", ifname) not in k.objects:
            return None
        return {"tx_bytes": 1, "tx_packets": 1, "rx_bytes": 2, "rx_packets": 2}

    def add_job_address(nipr, idx, ip, prefix, gateway) -> None:
        k.step("links.add_job_address")

    def list_links(ipr, prefix: str) -> list[str]:
        return sorted(n for kind, n in k.objects if kind == "link" and n.startswith(prefix))

    def verify_veth(ipr, host_if, nipr, job_if):
        if ("link", host_if) not in k.objects:
            return [drifted(f"veth {host_if}", "gone", "veth")], None, None
        return [present(f"veth {host_if}")], 7, 2

    def dhcp_acquire(ifname: str, mac: str, job: str, owner: str = "") -> Lease:
        k.step("dhcp.acquire")
        lease = Lease(address=f"198.51.100.{next(served)}", prefix=24, router="198.51.100.1",
                      server="198.51.100.2", lease_time=3600, t1=1800, t2=3150, obtained=time.time(), owner=owner)
        k.objects.add(("dhcp-lease", f"{lease.address}/{host_if_of_mac[mac]}"))
        return lease

    def dhcp_renew(ifname: str, mac: str, job: str, lease: Lease) -> Lease:
        k.step("dhcp.renew")
        return Lease(**{**lease.to_dict(), "obtained": time.time()})

    def dhcp_release(ifname: str, mac: str, job: str, lease: Lease) -> None:
        k.step("dhcp.release")
        k.objects -= {o for o in k.objects if o[0] == "dhcp-lease" and o[1].startswith(lease.address + "/")}

    def dhcpv6_acquire(cfg, key, netns_path, job_if, nipr, idx, job, timeout) -> tuple[str, int]:
        k.objects.add(("dhcpv6-client", key))   # dhcpcd runs from here on, lease or not: teardown stops it
        k.step("dhcp6.acquire")
        return "2001:db8:5::d", 128

    def dhcpv6_stop(cfg, key) -> bool:
        k.step("dhcp6.stop")
        found = ("dhcpv6-client", key) in k.objects
        k.objects.discard(("dhcpv6-client", key))
        return found

    def setup_dns(fwd, ipr, host_device, ipv4, ns_fd, netns_path, job_if, job_idx, job) -> list[str]:
        k.step("dns.setup_job")
        if not ipv4:
            return []
        if not k.loopback_ns6:
            return ["127.0.0.53"]
        k.objects.add(("dns6-relay", os.path.basename(netns_path)))  # the relay runs from here on
        return ["127.0.0.53", "::1"]

    def stop_dns6_relay(cfg, netns_path: str) -> bool:
        k.step("dns6.stop_relay")
        found = ("dns6-relay", os.path.basename(netns_path)) in k.objects
        k.objects.discard(("dns6-relay", os.path.basename(netns_path)))
        return found

    def dns6_relay_keys(cfg) -> set[str]:
        return {n[len(cfg.netns_prefix):] for kind, n in k.objects if kind == "dns6-relay"}

    return KernelOps(
        host_netlink=FakeNetlink,
        create_netns=create, attach_netns=attach, detach_netns=detach,
        is_mounted_netns=lambda path: ("netns", os.path.basename(path)) in k.objects,
        list_netns=list_named, verify_netns=verify_named, netlink_in=netlink_in, entered=entered,
        write_sysctl_in=lambda fd, key, value: k.step("sysctl"),
        create_veth=create_veth, delete_link=delete_link, list_links=list_links, link_stats=link_stats,
        bring_up_job_side=lambda nipr, name: k.step("links.bring_up") or 2,
        add_job_address=add_job_address, add_job_address6=lambda *a: k.step("links.add_job_address6"),
        verify_veth=verify_veth, verify_job_address=lambda *a: [present(f"address {a[3]}")],
        job_mtu=lambda ipr, cfg, mode: cfg.job_mtu or 1500,
        apply_shaping=lambda *a: k.step("shaping.apply"), verify_shaping=lambda *a: [present("tc htb")],
        secure_job_netns=lambda *a, **kw: k.step("job_netns.secure"),
        verify_job_netns=lambda *a, **kw: [present("job netns filter")],
        setup_dns=setup_dns, stop_dns6_relay=stop_dns6_relay, dns6_relay_keys=dns6_relay_keys,
        dhcp_acquire=dhcp_acquire, dhcp_renew=dhcp_renew, dhcp_release=dhcp_release,
        prepare_ipv6_auto=lambda ns_fd, autoconf=True: k.step("ipv6auto.prepare"),
        wait_for_slaac=lambda nipr, idx, job, timeout: k.step("ipv6auto.wait_for_slaac") or ("2001:db8:5::a", 64),
        dhcpv6_client_installed=lambda: True, dhcpv6_acquire=dhcpv6_acquire, dhcpv6_stop=dhcpv6_stop,
        dhcpv6_keys=lambda cfg: {n for kind, n in k.objects if kind == "dhcpv6-client"},
        scitags_secure=lambda ns_fd, job, scitag, fireflies=False: k.step("scitags.secure"),
        scitags_verify=lambda ns_fd, scitag, fireflies=False: [present(f"SciTags table (tag {scitag})")],
        firefly_reporter=lambda collector: FakeFireflies(k, collector),
        fair_share=lambda floor: FakeFairShare(floor, k))


def fake_networker(tmp: str, monkeypatch=None, modes: tuple[str, ...] = ("nat",), ops: dict | None = None,
                   **cfg_overrides) -> tuple[JobNetworker, FakeKernel]:
    """A JobNetworker whose kernel is a FakeKernel: real records, pools and accounting in `tmp`; one fake attach
    mode per name in `modes` (nat, bridge, ovs_bridge); `ops`: KernelOps fields to use instead of the fake's
    (e.g. a real one, to test it under the orchestration). Nothing is patched: the fake kernel operations,
    firewall and modes are given to the JobNetworker (`monkeypatch` is accepted for the callers that pass it)."""
    k = FakeKernel()
    if set(modes) - {"nat"}:
        cfg_overrides = {**BRIDGED_CONFIG, **cfg_overrides}
    cfg = Config(run_dir=os.path.join(tmp, "run"), state_dir=os.path.join(tmp, "state"),
                 netns_dir=os.path.join(tmp, "netns"), subnet="10.77.0.0/29", **cfg_overrides).validate()
    os.makedirs(cfg.netns_dir)
    fw = FakeFirewall(cfg, k)
    net = JobNetworker(cfg, fw, RecordStore(cfg.records_dir), Accountant(fw),
                       FinishedStore(os.path.join(cfg.state_dir, "finished")),
                       kernel=dataclasses.replace(fake_kernel_ops(k), **(ops or {})))
    net.modes = {name: FAKE_MODES[name](cfg, k) for name in modes}
    net.engine = Engine([StepAfterAdd(r, k) for r in net.engine.resources])
    return net, k
