"""A stateful filter inside a job's own netns, for modes where the host cannot track the job's connections
(bridged frames, and this machine's kernel has no bridge conntrack). The job cannot change it: its netns
belongs to the initial user namespace and the job has no CAP_NET_ADMIN there.
"""
from __future__ import annotations

from ...errors import LarkError
from . import libnft

RULES = """table inet lark_job {
  chain input {
    type filter hook input priority 0; policy drop;
    iif "lo" accept
    ct state established,related accept
    meta l4proto icmp icmp type { destination-unreachable, time-exceeded, parameter-problem } accept
    meta l4proto ipv6-icmp accept
  }
}
"""


def block_inbound(ns_fd: int, job: str) -> None:
    """No new connections into the job; replies to its own connections pass."""
    rc, _, err = libnft.run_in_netns(ns_fd, RULES)
    if rc != 0:
        raise LarkError(f"nft failed: {err.strip()[:300]}", job=job, obj="inbound filter in the job's netns")
