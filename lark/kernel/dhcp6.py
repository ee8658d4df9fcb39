"""IPv6 by DHCPv6 for bridged and OVS jobs (`bridge_ipv6 = "dhcpv6"`), through a maintained client: dhcpcd.

larkd (root) starts one dhcpcd per job, inside the job's netns, before the job runs. dhcpcd solicits, adds the
leased address (a /128) to the job's device, forks to the background once it has it (`-w`), and renews the lease
for as long as the job runs; teardown stops it (nothing of it outlives the job's network). The routes come from
the site's router advertisements, which the job's kernel accepts (accept_ra, no SLAAC address): DHCPv6 carries no
routes. The leased address is then pinned by the same anti-spoofing as a static one (attach/ovs.py,
firewall/nftables.py), so a job that takes any other address sends nothing with it.

dhcpcd keeps its pid files, control sockets, DUID and leases under fixed paths (/run/dhcpcd, /var/lib/dhcpcd) and
names them after the interface, which is eth0 in every job: each job's dhcpcd therefore runs in a private mount
namespace where a per-job directory (`run_dir/dhcp6/<key>`, under a root-only parent, so no job reaches another's
control socket) is bind-mounted over both. Its hook script is /bin/true: nothing it learns (DNS servers, domain,
hostname, NTP) touches the host, which shares /etc/resolv.conf and the hostname with the job.
The DUID is derived from the job's MAC (`duid ll`), which is fixed per slot: the slot's next job gets the same
address back from a server that keeps leases per client.
"""
from __future__ import annotations

import logging
import os
import shutil
import time

from pyroute2 import IPRoute

from ..errors import LarkError
from . import jobproc
from .firewall.base import run_tool
from .ipv6auto import slaac_address
from .sections import Dhcp6Section

log = logging.getLogger(__name__)
CLIENT = "dhcpcd"
# The site's DHCP server sees a Solicit after at most 1 s (RFC 8415 SOL_MAX_DELAY); the rest is its answer.
CONFIG = """# written by larkd for one job; see lark/kernel/dhcp6.py
ipv6only
noipv6rs
duid ll
ia_na 1
script /bin/true
logfile /run/dhcpcd/dhcpcd.log
"""
# In a private mount namespace: the job's directory over dhcpcd's fixed paths, then dhcpcd in the job's netns.
MOUNT_AND_RUN = ('mkdir -p /run/dhcpcd /var/lib/dhcpcd && mount --bind "$1/run" /run/dhcpcd && '
                 'mount --bind "$1/db" /var/lib/dhcpcd && ns="$2" && shift 2 && exec nsenter --net="$ns" "$@"')


def job_dir(cfg: Dhcp6Section, key: str) -> str:
    return os.path.join(cfg.run_dir, "dhcp6", key)


def log_path(cfg: Dhcp6Section, key: str) -> str:
    """dhcpcd's own log of the job's lease (solicit, renewals), while the job runs."""
    return os.path.join(job_dir(cfg, key), "run", "dhcpcd.log")


def client_argv(cfg: Dhcp6Section, key: str, netns_path: str, job_if: str, timeout: float) -> list[str]:
    d = job_dir(cfg, key)
    return ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c", MOUNT_AND_RUN, "lark-dhcp6", d,
            netns_path, CLIENT, f"--config={d}/dhcpcd.conf", "-6", "-w", f"--timeout={max(1, round(timeout))}",
            job_if]


def _prepare_dir(cfg: Dhcp6Section, key: str, netns_path: str) -> str:
    parent = os.path.join(cfg.run_dir, "dhcp6")
    os.makedirs(parent, mode=0o700, exist_ok=True)
    os.chmod(parent, 0o700)  # the jobs' control sockets are below: root only
    d = job_dir(cfg, key)
    shutil.rmtree(d, ignore_errors=True)  # a previous job's lease and pid file on this slot
    for sub in ("run", "db"):
        # dhcpcd drops to its own user after start (privilege separation) and still writes here.
        os.makedirs(os.path.join(d, sub), mode=0o755)
    with open(os.path.join(d, "dhcpcd.conf"), "w") as f:
        f.write(CONFIG)
    jobproc.record_netns(d, netns_path)
    return d


def acquire(cfg: Dhcp6Section, key: str, netns_path: str, job_if: str, nipr: IPRoute, idx: int, job: str,
            timeout: float) -> tuple[str, int]:
    """Start the job's dhcpcd and return the leased address once the job's device has it and a default route
    (from the site's router advertisement). On failure, the caller's teardown stops what was started."""
    _prepare_dir(cfg, key, netns_path)
    obj = "IPv6 by DHCPv6 (bridge_ipv6 = \"dhcpv6\")"
    if shutil.which(CLIENT) is None:
        raise LarkError("dhcpcd is not installed", job=job, obj=obj,
                        fix="install dhcpcd (Debian/Ubuntu: dhcpcd-base; EL: dhcpcd), or use bridge_ipv6 = \"slaac\"")
    started = time.monotonic()
    cp = run_tool(client_argv(cfg, key, netns_path, job_if, timeout), what="dhcpcd", check=False,
                  timeout=timeout + 10)
    if cp.returncode != 0:
        tail = " | ".join(line for line in (cp.stderr or "").strip().splitlines()[-3:])
        raise LarkError(f"no DHCPv6 lease within {timeout:g} s (dhcpcd: {tail[:300]})", job=job, obj=obj,
                        fix="check that the site's DHCPv6 server serves addresses (IA_NA) on the job network, "
                            "or use bridge_ipv6 = \"slaac\" or \"static\"")
    got = slaac_address(nipr, idx)  # with autoconf off, the only global address is the leased one
    if got is None:
        raise LarkError("dhcpcd reported a lease but the job's device has no global IPv6 address", job=job, obj=obj,
                        fix="see larkd's log for dhcpcd's messages")
    deadline = started + timeout
    while not nipr.get_default_routes(family=10):
        if time.monotonic() >= deadline:
            raise LarkError(f"DHCPv6 gave {got[0]} but no router advertisement came within {timeout:g} s, so the "
                            "job would have no IPv6 route", job=job, obj=obj,
                            fix="make the site's router advertise on the job network (with the M flag for "
                                "DHCPv6), or use bridge_ipv6 = \"static\" with bridge_gateway6")
        time.sleep(0.05)
    log.info("job %s leased %s/%d by DHCPv6 (dhcpcd pid %s, log %s) in %.2f s", job, got[0], got[1],
             running_pid(cfg, key), log_path(cfg, key), time.monotonic() - started)
    return got


def running_pid(cfg: Dhcp6Section, key: str) -> int | None:
    """The job's dhcpcd manager, if it still runs (dhcpcd rewrites its command line, so the netns it sits in is
    what tells it from a reused pid)."""
    run = os.path.join(job_dir(cfg, key), "run")
    try:
        pid_files = [os.path.join(run, n) for n in os.listdir(run) if n.endswith(".pid")]
    except OSError:
        return None
    return jobproc.find(job_dir(cfg, key), pid_files, CLIENT)


def stop(cfg: Dhcp6Section, key: str) -> bool:
    """Stop the job's dhcpcd (it then removes its address) and remove its directory; safe to repeat.
    True when a client was running."""
    return jobproc.stop_and_remove(running_pid(cfg, key), job_dir(cfg, key), f"dhcpcd of {key}")


def job_keys(cfg: Dhcp6Section) -> set[str]:
    """Keys with a DHCPv6 client directory (for gc)."""
    return set(jobproc.directories(os.path.join(cfg.run_dir, "dhcp6")))
