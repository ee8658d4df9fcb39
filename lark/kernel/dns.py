"""Name resolution for jobs when the host's resolver listens on loopback (systemd-resolved's 127.0.0.53 stub,
a local dnsmasq/unbound/nscd on 127.0.0.1).

A job shares the host's /etc/resolv.conf (HTCondor gives it no mount namespace of its own), so it sends its
queries to 127.0.0.53 in *its own* netns, where nothing listens. Other runtimes solve the same problem by putting
a forwarder on an address the container can reach and pointing the container's resolv.conf at it (netavark runs
aardvark-dns on the bridge gateway, libvirt and the CNI dnsname plugin run dnsmasq there; podman without it drops
loopback nameservers and falls back to systemd-resolved's upstream list). Lark cannot rewrite the job's
resolv.conf, so it steers the packets instead:

* on the host, one dnsmasq (a maintained forwarder, started by larkd, surviving larkd restarts through its pid
  file) listens on a link-local service address (`dns_address`, default 169.254.53.53) on a Lark-owned device,
  and forwards to the nameservers of `resolv_conf`. It runs in the host's netns, so it reaches 127.0.0.53 the
  way any host process does, and systemd-resolved (which answers localhost senders only) sees 127.0.0.1.
* in the job's netns (owned by the initial user namespace: the job cannot change any of it), an nftables table
  DNATs UDP/TCP port 53 to the loopback nameservers over to the service address, masquerades the 127.0.0.1
  source to the job's own address, and drops anything from outside addressed to 127.0.0.0/8 (route_localnet,
  which the DNAT needs, would otherwise expose the job's loopback to its link). Bridged jobs get a host route
  to the service address via the host's address on their bridge.
* the host firewall lets a job reach only that address and port (the rest of the host stays closed), only when
  its policy allows outbound connections (a name lookup carries data out to any zone's server, so without
  outbound connectivity DNS would be a tunnel), at most `dns_query_rate` queries a second (one job cannot fill
  the forwarder's table of pending queries), and counts the queries and answers in the job's bytes (the `dns_*`
  pieces of firewall/nftables.py and firewall/iptables.py).
* dnsmasq drops root for `dns_user` (created here when missing), a user no job runs as: with dnsmasq's default
  (nobody), a job running as nobody could signal it and end every job's name resolution.
"""
from __future__ import annotations

import contextlib
import ipaddress
import logging
import os
import pwd
import signal
import threading
import time
from pathlib import Path

from pyroute2 import IPRoute
from pyroute2.netlink.exceptions import NetlinkError

from ..errors import LarkError
from ..names import DNS_DEVICE
from . import dns6, netns
from .firewall import libnft
from .firewall.base import run_tool
from .sections import DnsSection

log = logging.getLogger(__name__)
RTNH_F_ONLINK = 4
# The forwarder's table of queries waiting for an upstream answer (dnsmasq's --dns-forward-max, default 150; dnsmasq
# 2.90 counts it per upstream server, and the forwarder's is usually the one loopback resolver): when it is full,
# every job's new queries are refused. A query for a zone whose server stalls holds its entry for
# dnsmasq's 10 s timeout, so one job at `dns_query_rate` holds at most 2 * rate + 10 * rate entries (240 at the
# default of 20): this many take 17 such jobs at once. dnsmasq shares 64 sockets among them: entries are cheap.
FORWARD_MAX = 4096


def loopback_nameservers(path: str, version: int = 4) -> list[str]:
    """Nameservers of a resolv.conf that a job cannot reach from its own netns: IPv4 (127.0.0.0/8) or, with
    version=6, IPv6 (::1; answered by a relay in the job's netns, dns6.py)."""
    try:
        with open(path) as f:
            text = f.read()
    except OSError as e:
        log.warning("cannot read %s (%s): jobs keep whatever resolver they find", path, e)
        return []
    out = []
    for line in text.splitlines():
        parts = line.split("#", 1)[0].split()
        if len(parts) >= 2 and parts[0] == "nameserver":
            try:
                addr = ipaddress.ip_address(parts[1].split("%", 1)[0])
            except ValueError:
                continue
            if addr.is_loopback and addr.version == version and str(addr) not in out:
                out.append(str(addr))
    return out


def job_ruleset(nameservers: list[str], service: str) -> str:
    """The nftables table that steers a job's DNS for loopback nameservers to the host's forwarder."""
    targets = ", ".join(nameservers)
    return f"""table ip lark_dns {{
  chain steer {{
    type nat hook output priority -100; policy accept;
    ip daddr {{ {targets} }} meta l4proto {{ udp, tcp }} th dport 53 dnat to {service}
  }}
  chain source {{
    type nat hook postrouting priority 100; policy accept;
    oif != "lo" ip saddr 127.0.0.0/8 masquerade
  }}
  chain guard {{
    type filter hook prerouting priority -300; policy accept;
    iif != "lo" ip daddr 127.0.0.0/8 drop
  }}
}}
"""


def steer_job(ns_fd: int, job_if: str, job_idx: int, nameservers: list[str], service: str,
              via: str | None, job: str) -> None:
    """Make the job's queries to loopback nameservers reach the host's forwarder (inside the job's netns).

    `via`: the host's address on a bridged job's network (the route to the service address); None in NAT
    mode, where the job's default route already leads to the host.
    """
    if not nameservers:
        return
    # Locally generated packets to 127/8 may leave through a real device only with route_localnet;
    # the guard chain keeps the job's loopback closed to its link.
    netns.write_sysctl_in(ns_fd, f"net.ipv4.conf.{job_if}.route_localnet", "1")
    rules = job_ruleset(nameservers, service)
    rc, _, err = libnft.run_in_netns(ns_fd, rules)
    if rc != 0:
        raise LarkError(f"nft failed: {err.strip()[:300]}", job=job, obj="DNS steering in the job's netns")
    route_to_forwarder(ns_fd, job_idx, service, via)


def route_to_forwarder(ns_fd: int, job_idx: int, service: str, via: str | None) -> None:
    """A bridged job's host route to the forwarder's address, via the host's address on its network."""
    if via:
        with netns.netlink_in(ns_fd) as nipr:
            nipr.route("add", dst=f"{service}/32", gateway=via, oif=job_idx, flags=RTNH_F_ONLINK)


def host_address_on(ipr: IPRoute, ifname: str) -> str | None:
    """The host's first IPv4 address on a device (a bridged job reaches the forwarder through it)."""
    idx = ipr.link_lookup(ifname=ifname)
    if not idx:
        return None
    for a in ipr.get_addr(index=idx[0], family=2):
        return a.get_attr("IFA_ADDRESS")
    return None


def _uid_of(pid: int) -> int | None:
    try:
        return os.stat(f"/proc/{pid}").st_uid
    except OSError:
        return None


def ensure_user(name: str) -> int:
    """The uid of `dns_user`, created as a system user with its own group when it is missing (what the packages'
    sysusers.d entry would do; an admin who manages users centrally provisions it instead)."""
    try:
        return pwd.getpwnam(name).pw_uid
    except KeyError:
        pass
    what = f"the DNS forwarder's user {name!r} (config key dns_user)"
    cp = run_tool(["useradd", "--system", "--user-group", "--no-create-home", "--home-dir", "/nonexistent",
                   "--shell", "/usr/sbin/nologin", "--comment", "Lark DNS forwarder", name], what=what, check=False)
    if cp.returncode != 0:
        raise LarkError(f"useradd failed: {cp.stderr.strip()[:300]}", obj=what,
                        fix=f"create it (a system user no job runs as, e.g. `useradd --system --user-group {name}`) "
                            "or name an existing one in LARK_DNS_USER")
    log.info("created system user %s for the DNS forwarder", name)
    return pwd.getpwnam(name).pw_uid


class Forwarder:
    """The host-side DNS forwarder: a Lark-owned device holding `dns_address`, and a dnsmasq on it."""

    def __init__(self, cfg: DnsSection):
        self.cfg = DnsSection.expect(cfg)  # only the knobs it reads (lark/kernel/sections.py)
        self.pid_file = os.path.join(self.cfg.run_dir, "dns-forwarder.pid")
        self._lock = threading.Lock()

    @property
    def wanted(self) -> list[str]:
        """The loopback nameservers jobs must be steered away from ([] when there is nothing to do)."""
        return loopback_nameservers(self.cfg.resolv_conf) if self.cfg.dns_forward else []

    @property
    def wanted6(self) -> list[str]:
        """The IPv6 loopback nameservers (::1) a relay in each job's netns must answer on."""
        return loopback_nameservers(self.cfg.resolv_conf, 6) if self.cfg.dns_forward else []

    def running_pid(self) -> int | None:
        try:
            pid = int(Path(self.pid_file).read_text().strip())
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except (OSError, ValueError):
            return None
        # A reused pid is not ours: the command line must name this pid file.
        if cmdline and os.path.basename(cmdline[0]) == b"dnsmasq" and f"--pid-file={self.pid_file}".encode() \
                in cmdline:
            return pid
        return None

    def ensure(self, ipr: IPRoute) -> None:
        """Device, address and dnsmasq present; cheap when they are (called before every job that needs it)."""
        with self._lock:
            self._ensure_device(ipr)
            uid = ensure_user(self.cfg.dns_user)
            pid = self.running_pid()
            if pid is not None and _uid_of(pid) != uid:
                # Started by an older larkd, as nobody (or before dns_user changed): jobs could signal it.
                log.warning("DNS forwarder (pid %d) does not run as %s: restarting it", pid, self.cfg.dns_user)
                self._terminate(pid)
                pid = None
            if pid is None:
                self._start()

    def _ensure_device(self, ipr: IPRoute) -> None:
        idx = ipr.link_lookup(ifname=DNS_DEVICE)
        if not idx:
            # dummy is the natural home of a service address; kernels built without it have ifb, which is
            # just as inert when nothing redirects traffic to it.
            for kind in ("dummy", "ifb"):
                try:
                    ipr.link("add", ifname=DNS_DEVICE, kind=kind)
                    break
                except NetlinkError as e:
                    log.debug("cannot create %s device %s: %s", kind, DNS_DEVICE, e)
            idx = ipr.link_lookup(ifname=DNS_DEVICE)
            if not idx:
                raise LarkError("cannot create the DNS forwarder's device (no dummy or ifb support)", obj=DNS_DEVICE,
                                fix="load the dummy module, or set dns_forward = false and give the host a "
                                    "resolver jobs can reach")
        have = {a.get_attr("IFA_ADDRESS") for a in ipr.get_addr(index=idx[0], family=2)}
        if self.cfg.dns_address not in have:
            ipr.addr("add", index=idx[0], address=self.cfg.dns_address, prefixlen=32)
        ipr.link("set", index=idx[0], state="up")

    def argv(self) -> list[str]:
        # No --interface: with one, dnsmasq also listens on lo (127.0.0.1 and ::1), where the host's own
        # resolver (the one it forwards to) may be listening.
        return ["dnsmasq", "--conf-file=/dev/null", f"--pid-file={self.pid_file}",
                f"--listen-address={self.cfg.dns_address}", "--bind-interfaces",
                f"--no-dhcp-interface={DNS_DEVICE}", f"--resolv-file={self.cfg.resolv_conf}", "--no-hosts",
                f"--dns-forward-max={FORWARD_MAX}", *dns6.run_as(self.cfg)]

    def _start(self) -> None:
        os.makedirs(self.cfg.run_dir, exist_ok=True)
        # dnsmasq daemonizes (the pid file is written by then): it outlives a larkd crash, and the next larkd
        # adopts it by its pid file.
        cp = run_tool(self.argv(), what="DNS forwarder (dnsmasq)", check=False)
        if cp.returncode != 0:
            raise LarkError(f"dnsmasq did not start: {cp.stderr.strip()[:300]}", obj="DNS forwarder",
                            fix=f"make sure nothing else listens on {self.cfg.dns_address}:53, or set "
                                "dns_forward = false")
        deadline = time.time() + 5
        while self.running_pid() is None and time.time() < deadline:
            time.sleep(0.02)
        log.info("DNS forwarder listening on %s:53, forwarding to the nameservers of %s (pid %s)",
                 self.cfg.dns_address, self.cfg.resolv_conf, self.running_pid())

    @staticmethod
    def _terminate(pid: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
        for _ in range(100):
            if not os.path.exists(f"/proc/{pid}"):
                break
            time.sleep(0.02)

    def stop(self, ipr: IPRoute | None = None) -> bool:
        """End our dnsmasq (by its pid file) and remove the device; safe to repeat."""
        done = False
        pid = self.running_pid()
        if pid is not None:
            self._terminate(pid)
            done = True
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.pid_file)
        own = ipr or IPRoute()
        try:
            idx = own.link_lookup(ifname=DNS_DEVICE)
            if idx:
                own.link("del", index=idx[0])
                done = True
        finally:
            if ipr is None:
                own.close()
        return done


def forwarder_status(cfg: DnsSection) -> str:
    """One line for `lark doctor` / status: what Lark does about the host's resolver."""
    loop = loopback_nameservers(cfg.resolv_conf) + loopback_nameservers(cfg.resolv_conf, 6)
    if not loop:
        return f"{cfg.resolv_conf}: no loopback nameserver, jobs use it as it is"
    if not cfg.dns_forward:
        return (f"{cfg.resolv_conf}: loopback nameservers {', '.join(loop)} and dns_forward = false: jobs cannot "
                "resolve names (fix: set dns_forward = true)")
    return (f"{cfg.resolv_conf}: loopback nameservers {', '.join(loop)}: larkd forwards jobs' DNS through "
            f"{cfg.dns_address}")



def setup_job(fwd: Forwarder, ipr: IPRoute, host_device: str | None, ipv4: str | None, ns_fd: int, netns_path: str,
              job_if: str, job_idx: int, job: str) -> list[str]:
    """Steer one job's DNS for the host's loopback nameservers to the forwarder; the nameservers steered.
    `host_device`: the host's device on a bridged job's network (AttachMode.host_device), None for NAT."""
    servers, servers6 = fwd.wanted, fwd.wanted6
    if servers6 and not ipv4:
        # The relay forwards to the forwarder's IPv4 address over the job's link.
        log.warning("job %s has no IPv4 address, so it cannot resolve names through %s", job, ", ".join(servers6))
    if not (servers or servers6) or not ipv4:
        return []
    try:
        fwd.ensure(ipr)
    except LarkError as e:
        # A job without name resolution still runs (as it would without Lark); `lark doctor` names the fix.
        log.error("job %s: no DNS forwarder, so it cannot resolve names through %s: %s", job,
                  ", ".join(servers + servers6), e)
        return []
    via = None
    if host_device is not None:
        via = host_address_on(ipr, host_device)
        if via is None:
            log.warning("job %s: the host has no IPv4 address on %s, so the job cannot reach the DNS forwarder "
                        "for %s", job, host_device, ", ".join(servers))
            return []
    if servers:
        steer_job(ns_fd, job_if, job_idx, servers, fwd.cfg.dns_address, via, job)
    else:
        route_to_forwarder(ns_fd, job_idx, fwd.cfg.dns_address, via)
    if servers6:
        try:
            dns6.start_relay(fwd.cfg, netns_path, servers6, job)
        except LarkError as e:
            # As without a forwarder: the job runs, without name resolution through ::1.
            log.error("job %s: no DNS relay, so it cannot resolve names through %s: %s", job, ", ".join(servers6), e)
            return servers
    return servers + servers6
