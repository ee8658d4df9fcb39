"""The filter inside a job's own netns. The job cannot change it: its netns belongs to the initial user namespace
and the job has no CAP_NET_ADMIN there.

Two parts. Every job gets the output chain: only larkd's own DHCP client messages leave the job's netns (a job that
speaks DHCP to the site's server could release its own lease and keep the address, so the server hands it to
another host, or take addresses for clients that do not exist). With InboundConnectivity off, the input chain is a
stateful "no new inbound" filter, for modes where the host cannot track the job's connections (bridged frames, on
kernels without bridge conntrack, and a NAT job's connections from the EP host itself).
"""
from __future__ import annotations

import json

from ...errors import LarkError
from ..drift import Finding, drifted, present
from . import libnft

# Set with SO_MARK on larkd's DHCPv4 socket (kernel/dhcp.py). Setting a mark needs CAP_NET_ADMIN or CAP_NET_RAW in
# the user namespace that owns the job's netns, which no job process has: a job's own messages carry none.
DHCP_MARK = 0x4C4B0043

# The site's DHCPv6 server answers larkd's dhcpcd (renewals go to a multicast group) from a unicast address:
# conntrack cannot tie that answer to the request. Port 546 is privileged: no job process can bind it, so this
# reaches dhcpcd only (which checks the transaction id and the server's DUID).
DHCPV6_REPLIES = "    meta nfproto ipv6 udp sport 547 udp dport 546 accept\n"

# DHCP client messages to a server or relay (port 67; DHCPv6: 547, in either family) leave only from larkd: its
# DHCPv4 socket by its mark, dhcpcd (DHCPv6) by its source port 546, which only root can bind. Dropped in output,
# a job's send fails at once with EPERM.
OUTPUT = f"""  chain output {{
    type filter hook output priority 0; policy accept;
    udp dport 67 meta mark != {DHCP_MARK:#x} drop
    udp dport 547 udp sport != 546 drop
  }}
"""

INPUT = """  chain input {
    type filter hook input priority 0; policy drop;
    iif "lo" accept
    ct state established,related accept
    meta l4proto icmp icmp type { destination-unreachable, time-exceeded, parameter-problem } accept
    meta l4proto ipv6-icmp accept
"""


def rules(block_inbound: bool, dhcpv6_client: bool = False) -> str:
    """The job netns's table: the DHCP guard, and the inbound filter when asked (with larkd's DHCPv6 client in the
    netns, admitting the DHCPv6 server's answers)."""
    chains = OUTPUT
    if block_inbound:
        chains += INPUT + (DHCPV6_REPLIES if dhcpv6_client else "") + "  }\n"
    return "table inet lark_job {\n" + chains + "}\n"


def secure(ns_fd: int, job: str, *, block_inbound: bool, dhcpv6_client: bool = False) -> None:
    """Put the job netns's filter in place (before the job runs)."""
    rc, _, err = libnft.run_in_netns(ns_fd, rules(block_inbound, dhcpv6_client))
    if rc != 0:
        what = "DHCP guard and inbound filter" if block_inbound else "DHCP guard"
        raise LarkError(f"nft failed: {err.strip()[:300]}", job=job, obj=f"{what} in the job's netns",
                        fix="check that nftables works in the job's netns (lark doctor)")


def verify(ns_fd: int, *, block_inbound: bool, dhcpv6_client: bool = False) -> list[Finding]:
    """The filter `secure` put in the job's netns: each chain of `rules` there, with as many rules."""
    rc, out, _ = libnft.run_in_netns(ns_fd, "list table inet lark_job")
    objs = json.loads(out).get("nftables", []) if rc == 0 and out.strip() else []
    fix = "something other than larkd ran nft in the job's netns (the job itself cannot: no CAP_NET_ADMIN there)"
    if rc != 0:
        return [drifted("nft table inet lark_job in the job's netns",
                        "the job's DHCP guard (and inbound filter) are gone", fix)]
    found = []
    for chain, want in _chains(rules(block_inbound, dhcpv6_client)).items():
        what = f"nft chain {chain} of table inet lark_job in the job's netns"
        if not any(o.get("chain", {}).get("name") == chain for o in objs):
            found.append(drifted(what, "the chain is gone", fix))
            continue
        have = sum(1 for o in objs if o.get("rule", {}).get("chain") == chain)
        found.append(present(what) if have == want else drifted(what, f"{have} rule(s) where setup put {want}", fix))
    return found


def _chains(text: str) -> dict[str, int]:
    """Chain name -> number of rules in the table text `rules` writes (one statement a line, after the type line)."""
    out: dict[str, int] = {}
    chain = None
    for line in (raw.strip() for raw in text.splitlines()):
        if line.startswith("chain "):
            chain = line.split()[1]
            out[chain] = 0
        elif line == "}":
            chain = None
        elif chain and line and not line.startswith("type "):
            out[chain] += 1
    return out
