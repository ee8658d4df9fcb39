"""The firewall driver interface: NAT, isolation, anti-spoofing and per-job counters for one backend."""
from __future__ import annotations

import abc
import subprocess
from dataclasses import dataclass

from ...errors import LarkError
from ...names import JobNames
from ...plan import JobNetwork
from ..drift import Finding
from ..sections import FirewallSection


@dataclass
class Counters:
    bytes_in: int = 0      # toward the job
    bytes_out: int = 0     # from the job
    packets_in: int = 0
    packets_out: int = 0


# The rule sets a job's host firewall rules come in; its attach mode names one (AttachMode.firewall_rules), so the
# drivers never ask which mode a job is in.
ROUTED = "routed"      # routed through the host (NAT): the inet table's forward, DNAT and masquerade rules
BRIDGED = "bridged"    # a port of a Linux bridge: the bridge-family table's per-port rules
SWITCHED = "switched"  # switched by OVS outside netfilter: OpenFlow does the filtering; only the host guard's sets


class Firewall(abc.ABC):
    name = "abstract"

    def __init__(self, cfg: FirewallSection):
        self.cfg = FirewallSection.expect(cfg)  # only the knobs the drivers read (lark/kernel/sections.py)

    @abc.abstractmethod
    def ensure_base(self) -> None:
        """Create the shared objects (NAT, catch-all drops for unknown job interfaces); idempotent."""

    @abc.abstractmethod
    def destroy_base(self) -> None:
        """Remove everything this backend ever created; idempotent."""

    def ensure_bridge_base(self) -> None:
        """Shared filtering for bridged job ports, in place before the first port joins the bridge (once the
        bridge exists); idempotent. Backends without bridge filtering refuse bridged jobs in add_job."""

    @abc.abstractmethod
    def add_job(self, plan: JobNetwork, names: JobNames, rules: str) -> None:
        """Install the job's rules and counters atomically; `rules` is its mode's rule set (ROUTED, ...)."""

    @abc.abstractmethod
    def remove_job(self, names: JobNames) -> Counters | None:
        """Remove the job's rules and counters; safe to repeat.

        Returns the job's counters as read just before removal (the final reading), or None when nothing of
        the job was there.
        """

    @abc.abstractmethod
    def verify_job(self, plan: JobNetwork, names: JobNames, rules: str) -> list[Finding]:
        """What add_job made for this job, read back from the kernel without changing it (`lark status --verify`)."""

    @abc.abstractmethod
    def read_counters(self) -> dict[str, Counters]:
        """Counters of every job, keyed by job key, in one read."""

    @abc.abstractmethod
    def job_keys(self) -> set[str]:
        """Keys of every job that has objects in the firewall (for gc)."""

    @abc.abstractmethod
    def base_present(self) -> bool:
        """Whether any shared object exists (for gc and doctor)."""


def dns_allowed(cfg: FirewallSection, net: JobNetwork) -> bool:
    """Whether the firewall admits the job to the host's DNS forwarder (lark/kernel/dns.py). Not without outbound
    connectivity, nor when the pool controller drops its traffic or WAN traffic: query names carry data to any
    zone's server, so DNS would be the job's tunnel out."""
    return cfg.dns_forward and net.outbound and not net.dns_revoked_by


def run_tool(argv: list[str], *, input: str | None = None, what: str, check: bool = True,
             timeout: float = 30) -> subprocess.CompletedProcess:
    try:
        cp = subprocess.run(argv, input=input, capture_output=True, text=True, timeout=timeout)
    except FileNotFoundError:
        raise LarkError(f"{argv[0]} is not installed", obj=what, fix=f"install the package providing {argv[0]}") \
            from None
    except subprocess.TimeoutExpired:
        raise LarkError(f"{argv[0]} did not answer within {timeout} s", obj=what) from None
    if check and cp.returncode != 0:
        raise LarkError(f"{argv[0]} failed: {cp.stderr.strip()[:500]}", obj=what)
    return cp
