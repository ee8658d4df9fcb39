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


# The site's DHCPv6 server answers larkd's dhcpcd (renewals go to a multicast group) from a unicast address:
# conntrack cannot tie that answer to the request. Port 546 is privileged: no job process can bind it, so this
# reaches dhcpcd only (which checks the transaction id and the server's DUID).
DHCPV6_REPLIES = '    meta nfproto ipv6 udp sport 547 udp dport 546 accept\n'


def block_inbound(ns_fd: int, job: str, dhcpv6_client: bool = False) -> None:
    """No new connections into the job; replies to its own connections pass (and, with larkd's DHCPv6
    client in the netns, the DHCPv6 server's answers)."""
    rules = RULES.replace("  }\n}\n", DHCPV6_REPLIES + "  }\n}\n") if dhcpv6_client else RULES
    rc, _, err = libnft.run_in_netns(ns_fd, rules)
    if rc != 0:
        raise LarkError(f"nft failed: {err.strip()[:300]}", job=job, obj="inbound filter in the job's netns")
