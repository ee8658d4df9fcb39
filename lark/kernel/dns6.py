"""IPv6 loopback resolvers (`nameserver ::1` in the host's resolv.conf: unbound, dnsmasq or a stub on ::1).

For 127.0.0.53, dns.py steers the job's queries out of its netns with a DNAT (route_localnet lets them leave).
IPv6 has no route_localnet: the kernel drops a packet addressed to ::1 that arrives on any device but `lo`
(measured: the DNATed query reached the forwarder, its answer, translated back to ::1 on the job's eth0, was
counted in Ip6InAddrErrors and dropped). So ::1 must be answered inside the job's netns: larkd starts a small
dnsmasq there (one per job, only when the host's resolv.conf has an IPv6 loopback nameserver) that listens on
[::1]:53 only and forwards to the host's forwarder at `dns_address`, over the job's own link, so the queries take
the same allowed and counted path as the IPv4 ones and are answered from the host's resolver. The job cannot
touch it: it runs as `dns_user` after binding (never nobody, which jobs run as: a job could signal another job's
relay), in a netns where the job has no CAP_NET_ADMIN. Teardown stops it before the netns goes.

Each function takes only the DNS section (lark/kernel/sections.py).
"""
from __future__ import annotations

import grp
import logging
import os
import pwd
import shutil
import time

from ..errors import LarkError
from . import jobproc
from .firewall.base import run_tool
from .sections import DnsSection

log = logging.getLogger(__name__)


def run_as(cfg: DnsSection) -> list[str]:
    """dnsmasq's options to drop root for `dns_user` and its primary group (its defaults are nobody and dip)."""
    try:
        user = pwd.getpwnam(cfg.dns_user)
        group = grp.getgrgid(user.pw_gid).gr_name
    except KeyError:
        raise LarkError(f"user {cfg.dns_user!r} or its primary group does not exist", obj="config key dns_user",
                        fix=f"create a system user no job runs as: useradd --system --user-group {cfg.dns_user}") \
            from None
    return [f"--user={cfg.dns_user}", f"--group={group}"]


def relay_dir(cfg: DnsSection, netns_path: str) -> str:
    return os.path.join(cfg.run_dir, "dns6", os.path.basename(netns_path))


def relay_argv(cfg: DnsSection, netns_path: str, listen: list[str]) -> list[str]:
    d = relay_dir(cfg, netns_path)
    return ["nsenter", f"--net={netns_path}", "dnsmasq", "--conf-file=/dev/null", f"--pid-file={d}/dnsmasq.pid",
            *(f"--listen-address={a}" for a in listen), "--bind-interfaces", "--no-resolv", "--no-hosts",
            f"--server={cfg.dns_address}", "--cache-size=0", *run_as(cfg)]


def start_relay(cfg: DnsSection, netns_path: str, listen: list[str], job: str) -> int:
    """A dnsmasq in the job's netns answering on the IPv6 loopback nameservers `listen`; its pid."""
    parent = os.path.join(cfg.run_dir, "dns6")
    os.makedirs(parent, mode=0o700, exist_ok=True)
    d = relay_dir(cfg, netns_path)
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d, mode=0o700)
    jobproc.record_netns(d, netns_path)
    cp = run_tool(relay_argv(cfg, netns_path, listen), what="IPv6 DNS relay (dnsmasq)", check=False)
    if cp.returncode != 0:
        raise LarkError(f"dnsmasq did not start in the job's netns: {cp.stderr.strip()[:300]}", job=job,
                        obj=f"DNS relay for nameserver {', '.join(listen)}",
                        fix="see larkd's log; set dns_forward = false to leave jobs without name resolution "
                            "through the host's IPv6 loopback resolver")
    deadline = time.monotonic() + 5
    while (pid := running_pid(cfg, netns_path)) is None and time.monotonic() < deadline:
        time.sleep(0.02)
    if pid is None:
        raise LarkError("the DNS relay started but is not running", job=job, obj=f"{d}/dnsmasq.pid",
                        fix="see larkd's log")
    log.info("job %s: DNS for %s answered in its netns by dnsmasq %d (forwarding to %s)", job, ", ".join(listen),
             pid, cfg.dns_address)
    return pid


def running_pid(cfg: DnsSection, netns_path: str) -> int | None:
    d = relay_dir(cfg, netns_path)
    return jobproc.find(d, [os.path.join(d, "dnsmasq.pid")], "dnsmasq")


def stop_relay(cfg: DnsSection, netns_path: str) -> bool:
    """Stop the job's relay and remove its directory; safe to repeat. True when one was running."""
    return jobproc.stop_and_remove(running_pid(cfg, netns_path), relay_dir(cfg, netns_path),
                                   f"DNS relay of {os.path.basename(netns_path)}")


def job_keys(cfg: DnsSection) -> set[str]:
    """Keys of jobs with a relay directory (for gc); the directories are named after the job's netns."""
    names = jobproc.directories(os.path.join(cfg.run_dir, "dns6"))
    return {n[len(cfg.netns_prefix):] for n in names if n.startswith(cfg.netns_prefix)}
