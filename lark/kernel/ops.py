"""The kernel operations the orchestration (lark/daemon/jobnet.py, resources.py, verify.py) calls, in one place.

The orchestration never calls lark/kernel/netns.py, links.py, shaping.py, mtu.py, dns.py or the job-netns filter
by module name: it calls the fields of the `KernelOps` it was given (JobNetworker's `kernel`; resources reach it
through their host, verify through the networker). `REAL` is the real kernel; the unit tests' fake kernel
(tests/helpers/fakekernel.py) builds another `KernelOps` and passes it in. The attach modes and the firewall
drivers are injected objects of their own (JobNetworker.modes, .fw).
"""
from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

from pyroute2 import IPRoute

from . import dns, links, mtu, netns, shaping
from .drift import Finding
from .firewall import job_netns


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


REAL = KernelOps()
