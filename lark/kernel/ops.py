"""The kernel operations the orchestration (lark/daemon/jobnet.py, resources.py, verify.py) calls, in one place.

The orchestration never calls lark/kernel/netns.py, links.py, shaping.py, mtu.py, dns.py, dns6.py, dhcp.py,
dhcp6.py, ipv6auto.py, scitags.py, fairshare.py or the job-netns filter by module name: it calls the fields of
the `KernelOps` it was given (JobNetworker's `kernel`; resources reach it through their host, verify through the
networker), and imports those modules only for types, constants and pure arithmetic (shaping.limit_for,
fairshare.shares). `REAL` is the real kernel; the unit tests' fake kernel (tests/helpers/fakekernel.py) builds
another `KernelOps` and passes it in. The attach modes and the firewall drivers are injected objects of their own
(JobNetworker.modes, .fw).
"""
from __future__ import annotations

import shutil
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

from pyroute2 import IPRoute

from . import dhcp, dhcp6, dns, dns6, ipv6auto, links, mtu, netns, scitags, shaping
from .drift import Finding
from .fairshare import FairShare
from .firewall import job_netns
from .sections import Dhcp6Section, DnsSection


def dhcp_acquire(ifname: str, mac: str, job: str, owner: str = "") -> dhcp.Lease:
    """A new DHCP lease for the job's device (call it inside the job's netns: `KernelOps.entered`)."""
    return dhcp.Client(ifname, mac, job, owner=owner).acquire()


def dhcp_renew(ifname: str, mac: str, job: str, lease: dhcp.Lease) -> dhcp.Lease:
    return dhcp.Client(ifname, mac, job).renew(lease)


def dhcp_release(ifname: str, mac: str, job: str, lease: dhcp.Lease) -> None:
    dhcp.Client(ifname, mac, job).release(lease)


def dhcpv6_client_installed() -> bool:
    """Whether this host can lease IPv6 by DHCPv6 (looked up each time: installing dhcpcd needs no restart)."""
    return shutil.which(dhcp6.CLIENT) is not None


@dataclass(frozen=True)
class KernelOps:
    """One field per kernel operation; each takes the arguments of the function it defaults to."""
    # A netlink socket in the host's netns (a context manager; larkd keeps one per worker thread).
    host_netlink: Callable[[], Any] = IPRoute
    # The job's network namespace (netns.py).
    create_netns: Callable[[str], int] = netns.create
    attach_netns: Callable[..., None] = netns.attach
    detach_netns: Callable[[str], bool] = netns.detach
    is_mounted_netns: Callable[[str], bool] = netns.is_mounted_netns
    list_netns: Callable[[str, str], list[str]] = netns.list_named
    verify_netns: Callable[[str, int], Finding] = netns.verify_named
    netlink_in: Callable[[int], AbstractContextManager[Any]] = netns.netlink_in
    entered: Callable[[int], AbstractContextManager[None]] = netns.entered
    write_sysctl_in: Callable[[int, str, str], None] = netns.write_sysctl_in
    # The veth and the job's addresses (links.py).
    create_veth: Callable[..., Any] = links.create_veth
    delete_link: Callable[[Any, str], bool] = links.delete_link
    list_links: Callable[[Any, str], list[str]] = links.list_links
    link_stats: Callable[[Any, str], dict | None] = links.link_stats
    bring_up_job_side: Callable[[Any, str | None], Any] = links.bring_up_job_side  # the job end's index (None: lo)
    add_job_address: Callable[..., None] = links.add_job_address
    add_job_address6: Callable[..., None] = links.add_job_address6
    verify_veth: Callable[..., tuple[list[Finding], int | None, int | None]] = links.verify_veth
    verify_job_address: Callable[..., list[Finding]] = links.verify_job_address
    # The veth's MTU (mtu.py), the rate limit (shaping.py), the filter in the job's netns, DNS steering.
    job_mtu: Callable[..., int] = mtu.for_job
    apply_shaping: Callable[..., None] = shaping.apply
    verify_shaping: Callable[..., list[Finding]] = shaping.verify
    secure_job_netns: Callable[..., None] = job_netns.secure
    verify_job_netns: Callable[..., list[Finding]] = job_netns.verify
    setup_dns: Callable[..., list[str]] = dns.setup_job
    dns_forwarder: Callable[[DnsSection], dns.Forwarder] = dns.Forwarder   # the host's forwarder (made once per EP)
    stop_dns6_relay: Callable[[DnsSection, str], bool] = dns6.stop_relay  # (section, the job's netns path)
    dns6_relay_keys: Callable[[DnsSection], set[str]] = dns6.job_keys
    # IPv4 from the site's DHCP server (dhcp.py), in the job's netns; the lease cache is larkd's files.
    dhcp_acquire: Callable[..., dhcp.Lease] = dhcp_acquire
    dhcp_renew: Callable[[str, str, str, dhcp.Lease], dhcp.Lease] = dhcp_renew
    dhcp_release: Callable[[str, str, str, dhcp.Lease], None] = dhcp_release
    lease_cache: Callable[[str], dhcp.LeaseCache] = dhcp.LeaseCache
    # IPv6 from the site: SLAAC (ipv6auto.py) or a DHCPv6 client in the job's netns (dhcp6.py).
    prepare_ipv6_auto: Callable[..., None] = ipv6auto.prepare_job_netns      # (ns_fd, autoconf=...)
    wait_for_slaac: Callable[[Any, int, str, float], tuple[str, int]] = ipv6auto.wait_for_slaac
    dhcpv6_client_installed: Callable[[], bool] = dhcpv6_client_installed
    dhcpv6_acquire: Callable[..., tuple[str, int]] = dhcp6.acquire
    dhcpv6_stop: Callable[[Dhcp6Section, str], bool] = dhcp6.stop          # (section, key)
    dhcpv6_keys: Callable[[Dhcp6Section], set[str]] = dhcp6.job_keys
    # SciTags in the job's netns and the firefly reporter (scitags.py).
    scitags_secure: Callable[..., None] = scitags.secure                     # (ns_fd, job, scitag, fireflies=...)
    scitags_verify: Callable[..., list[Finding]] = scitags.verify            # (ns_fd, scitag, fireflies=...)
    firefly_reporter: Callable[[tuple[str, int]], scitags.FireflyReporter] = scitags.FireflyReporter
    # The fair shares of unreserved jobs (fairshare.py: its rebalance changes running jobs' tc limits).
    fair_share: Callable[[float], FairShare] = FairShare


REAL = KernelOps()
