"""nftables backend: Lark owns exactly one table (`inet <nft_table>`) and touches nothing else.

Per-job chains are reached through verdict maps keyed by interface name, so adding or removing a job is a
single atomic transaction of map elements, chains and named counters, with no rule handles to track.
"""
from __future__ import annotations

import ipaddress
import json
import logging

from ...errors import LarkError
from ...names import HOST_IF_PREFIX, NFT_JOB_PREFIX, JobNames, key_from_host_if, link_local_of
from ...plan import JobNetwork
from .. import forwarding
from ..drift import Finding
from ..sections import FirewallSection
from . import libnft, nftcounters, nftverify
from .base import BRIDGED, SWITCHED, Counters, Firewall, dns_allowed

log = logging.getLogger(__name__)
WILDCARD = HOST_IF_PREFIX + "*"
MAPS = {"pre_from_job": "pre", "fwd_from_job": "out", "fwd_to_job": "in"}
# Bridge mode: bridged frames never reach the inet hooks (unless br_netfilter is loaded), so bridged jobs get
# their anti-spoofing and counters in a bridge-family table of the same name.
BR_MAPS = {"br_pre": "bpre", "br_out": "bout", "br_in": "bin"}
# DNS to the host's forwarder (lark/kernel/dns.py): NAT jobs reach it through the inet input hook, bridged
# jobs through the bridge table's input hook; per-job chains count it in the job's own counters.
DNS_MAPS = {"dns_from_job": "dout", "dns_to_job": "din"}
BR_DNS_MAPS = {"br_dns_from_job": "bdout", "br_dns_to_job": "bdin"}
DNS_MARK = 0x4C4B0035  # set on bridged jobs' queries in the bridge table, checked at the inet input hook
# "hp", "hpf": same-EP frames up the uplink, in the netdev table (lark/kernel/firewall/same_ep.py)
JOB_CHAINS = ("pre", "out", "in", "bpre", "bout", "bin", *DNS_MAPS.values(), *BR_DNS_MAPS.values(), "hp", "hpf")
ALL_MAPS = (*MAPS, *BR_MAPS, *DNS_MAPS, *BR_DNS_MAPS)
# The MACs of OVS jobs, each element commented with the job's host_if (for gc): the host guard's view of "from a
# job port" on the OVS bridge's internal port (see _ovs_host_guard).
OVS_JOBS = "ovs_jobs"
# The MACs of OVS jobs that may use the DNS forwarder (their policy allows outbound connections), and each one's
# query rate limit (a dynamic set: an element per MAC, made by its first query, gone a minute after its last).
OVS_DNS_JOBS = "ovs_dns_jobs"
OVS_DNS_RATE = "ovs_dns_rate"


def _payload(proto: str, field: str) -> dict:
    return {"payload": {"protocol": proto, "field": field}}


def _ne(left: dict, right) -> dict:
    return {"match": {"op": "!=", "left": left, "right": right}}


def _meta(key: str, value, op: str = "==") -> dict:
    return {"match": {"op": op, "left": {"meta": {"key": key}}, "right": value}}


def _ether_type(t: str) -> dict:
    # The frame's own EtherType: a VLAN tag the kernel moved to metadata still reads as 8021q here, where
    # `meta protocol` would name the inner protocol and let a tagged frame through.
    return {"match": {"op": "==", "left": _payload("ether", "type"), "right": t}}


def _v6_hex(addr: str) -> str:
    return f"0x{int(ipaddress.IPv6Address(addr)):032x}"


def bridge_allowlist(plan: JobNetwork, mac: str) -> list[list[dict]]:
    """The rules (expression lists) of a bridged job's ingress chain: what may enter the bridge from its port.

    An allowlist, ending in drop: the job's MAC with its own IPv4 address, DHCP client messages, ARP for its
    own address, and (with IPv6) its own addresses and link-local with neighbour discovery for those only.
    Everything else is dropped: VLAN-tagged frames and other EtherTypes, DHCP/DHCPv6 server messages, router
    advertisements and redirects, other sources."""
    drop, accept = {"drop": None}, {"accept": None}
    rules: list[list[dict]] = [
        [_ne(_payload("ether", "saddr"), mac), drop],
        [_ether_type("ip"), {"match": {"op": "==", "left": _payload("udp", "sport"), "right": 67}}, drop],
        [_ether_type("ip"), {"match": {"op": "==", "left": _payload("ip", "saddr"), "right": "0.0.0.0"}},
         {"match": {"op": "==", "left": _payload("udp", "sport"), "right": 68}},
         {"match": {"op": "==", "left": _payload("udp", "dport"), "right": 67}}, accept],
    ]
    if plan.ipv4:
        rules += [
            [_ether_type("ip"), {"match": {"op": "==", "left": _payload("ip", "saddr"), "right": plan.ipv4}},
             accept],
            [_ether_type("arp"), {"match": {"op": "==", "left": _payload("arp", "saddr ip"), "right": plan.ipv4}},
             {"match": {"op": "==", "left": _payload("arp", "saddr ether"), "right": mac}}, accept],
        ]
    if plan.ipv6:
        own = [plan.ipv6, link_local_of(mac)]
        icmp_type = _payload("icmpv6", "type")
        rules += [
            [_ether_type("ip6"), {"match": {"op": "==", "left": icmp_type,
                                            "right": {"set": ["nd-router-advert", "nd-redirect"]}}}, drop],
            [_ether_type("ip6"), {"match": {"op": "==", "left": _payload("udp", "sport"), "right": 547}}, drop],
            # A neighbour advertisement may only announce the job's own addresses (no nft name for the ND
            # target field on every version: it is the 128 bits after the first 8 bytes of ICMPv6).
            [_ether_type("ip6"), {"match": {"op": "==", "left": icmp_type, "right": "nd-neighbor-advert"}},
             _ne({"payload": {"base": "th", "offset": 64, "len": 128}}, {"set": [_v6_hex(a) for a in own]}), drop],
            [_ether_type("ip6"), {"match": {"op": "==", "left": _payload("ip6", "saddr"), "right": {"set": own}}},
             accept],
            # Duplicate address detection and MLD reports come from the unspecified address.
            [_ether_type("ip6"), {"match": {"op": "==", "left": _payload("ip6", "saddr"), "right": "::"}},
             {"match": {"op": "==", "left": icmp_type,
                        "right": {"set": ["nd-neighbor-solicit", "mld2-listener-report"]}}}, accept],
        ]
    rules.append([drop])
    return rules


def _ct_state(*states: str) -> dict:
    return {"match": {"op": "in", "left": {"ct": {"key": "state"}}, "right": list(states)}}


class NftablesFirewall(Firewall):
    name = "nftables"

    def __init__(self, cfg: FirewallSection):
        super().__init__(cfg)
        self.table = self.cfg.nft_table
        self.t = {"family": "inet", "table": self.table}
        self.tb = {"family": "bridge", "table": self.table}
        self._bridge_base_done = False  # the bridge table's base goes in once per daemon, with its first job

    # -- plumbing -------------------------------------------------------------------------------------
    def _apply(self, cmds: list[dict], what: str) -> None:
        rc, _, err = libnft.get().run(json.dumps({"nftables": cmds}))
        if rc != 0:
            raise LarkError(f"nft failed: {err.strip()[:500]}", obj=what)

    def _list(self, *what: str) -> list[dict]:
        rc, out, err = libnft.get().run("list " + " ".join(what))
        if rc != 0:
            if "No such file" in err or "does not exist" in err:
                return []
            raise LarkError(f"nft list failed: {err.strip()[:300]}", obj=f"nft table inet {self.table}")
        return json.loads(out).get("nftables", []) if out.strip() else []

    def _rule(self, chain: str, *expr: dict, t: dict | None = None) -> dict:
        return {"add": {"rule": {**(t or self.t), "chain": chain, "expr": list(expr)}}}

    def _antispoof(self, chain: str, plan: JobNetwork, t: dict | None = None) -> list[dict]:
        out = []
        fam = {"family": "nfproto"} if (t or self.t)["family"] == "inet" else {"family": "protocol"}
        v4, v6 = ("ipv4", "ipv6") if fam["family"] == "nfproto" else ("ip", "ip6")
        if plan.ipv4:
            out.append(self._rule(chain, _ne(_payload("ip", "saddr"), plan.ipv4), {"drop": None}, t=t))
        else:
            out.append(self._rule(chain, _meta(fam["family"], v4), {"drop": None}, t=t))
        if plan.ipv6:
            allowed = {"set": [plan.ipv6, "::", {"prefix": {"addr": "fe80::", "len": 10}}]}
            out.append(self._rule(chain, _ne(_payload("ip6", "saddr"), allowed), {"drop": None}, t=t))
        else:
            out.append(self._rule(chain, _meta(fam["family"], v6), {"drop": None}, t=t))
        return out

    # -- DNS to the host's forwarder ------------------------------------------------------------------
    def _dns_match(self, field: str) -> list[dict]:
        port = "dport" if field == "daddr" else "sport"
        return [{"match": {"op": "==", "left": _payload("ip", field), "right": self.cfg.dns_address}},
                {"match": {"op": "==", "left": {"meta": {"key": "l4proto"}}, "right": {"set": ["udp", "tcp"]}}},
                {"match": {"op": "==", "left": _payload("th", port), "right": 53}}]

    def _dns_rate_limited(self, chain: str, match: list[dict], accept: list[dict], t: dict | None = None,
                          per_mac: bool = False) -> list[dict]:
        """Rules of `chain` that pass one job's DNS matching `match` with `accept`, after dropping what exceeds
        `dns_query_rate`: UDP datagrams and TCP connection attempts are queries (each can hold an entry of the
        forwarder's table); the rest of a TCP connection passes. The limit is the rule's own, so per job for a
        per-job chain; `per_mac`: one shared rule keyed by source MAC (OVS jobs, all in the base chain)."""
        rate = self.cfg.dns_query_rate
        if not rate:
            return [self._rule(chain, *match, *accept, t=t)]
        limit = {"limit": {"rate": rate, "burst": 2 * rate, "per": "second", "inv": True}}
        if per_mac:
            limit = {"set": {"op": "update", "elem": _payload("ether", "saddr"), "set": f"@{OVS_DNS_RATE}",
                             "stmt": [limit]}}
        # TCP's flags byte read raw (offset 13): `tcp flags` would add a protocol dependency that clashes with the
        # udp-or-tcp match of `match`. SYN without ACK opens a connection.
        flags = {"payload": {"base": "th", "offset": 13 * 8, "len": 8}}
        not_syn = [_meta("l4proto", "tcp"), {"match": {"op": "!=", "left": {"&": [flags, 0x12]}, "right": 0x02}}]
        return [self._rule(chain, *match, *not_syn, *accept, t=t),
                self._rule(chain, *match, limit, {"drop": None}, t=t),
                self._rule(chain, *match, *accept, t=t)]

    def _dns_base(self) -> list[dict]:
        """inet table: jobs may reach the forwarder's port 53 and nothing else of its address; counted per job.
        Goes first in `inp`, before the established-accept, so every query is counted (and rate limited)."""
        if not self.cfg.dns_forward:
            return []
        t, dns = self.t, self.cfg.dns_address
        cmds: list[dict] = [{"add": {"map": {**t, "name": m, "type": "ifname", "map": "verdict"}}} for m in DNS_MAPS]
        # OVS_DNS_RATE is made by ensure_base in nft's text syntax: see _dns_rate_set.
        cmds += [{"add": {"set": {**t, "name": OVS_DNS_JOBS, "type": "ether_addr"}}}]
        cmds += [{"add": {"chain": {**t, "name": "outp", "type": "filter", "hook": "output", "prio": 0,
                                    "policy": "accept"}}},
                 {"flush": {"chain": {**t, "name": "outp"}}}]
        to_dns = {"match": {"op": "==", "left": _payload("ip", "daddr"), "right": dns}}
        cmds += [
            self._rule("inp", *self._dns_match("daddr"), {"vmap": {"key": {"meta": {"key": "iifname"}},
                                                                   "data": "@dns_from_job"}}),
            self._rule("inp", *self._dns_match("daddr"), _meta("mark", DNS_MARK), {"accept": None}),
        ]
        # OVS jobs arrive on the bridge's internal port, known by MAC: a port's OpenFlow allowlist lets out only its
        # job's MAC (and address), and the uplink's guard flow drops anything for dns_address from the site.
        cmds += self._dns_rate_limited("inp", [*self._dns_match("daddr"), _meta("iifname", self.cfg.ovs_bridge_name),
                                               {"match": {"op": "==", "left": _payload("ether", "saddr"),
                                                          "right": f"@{OVS_DNS_JOBS}"}}],
                                       [{"accept": None}], per_mac=True)
        # Nobody else (the site's neighbours included) talks to the forwarder.
        cmds.append(self._rule("inp", to_dns, _meta("iifname", "lo", op="!="), {"drop": None}))
        cmds.append(self._rule("outp", *self._dns_match("saddr"),
                               {"vmap": {"key": {"meta": {"key": "oifname"}}, "data": "@dns_to_job"}}))
        return cmds

    def _ovs_host_guard(self) -> list[dict]:
        """OVS jobs reach the host through the bridge's internal port, not through their `lk-*` device, so the
        catch-all drop for job devices misses them. This hook sees neither the switch port a frame came in by nor,
        for addresses from the site's DHCP server or SLAAC, an address Lark chose (the guard once matched
        `bridge_range` and missed those jobs). It does see the source MAC, and a job port's OpenFlow allowlist lets
        out no other MAC than the job's (attach/ovs.py): frames from a MAC in `ovs_jobs` come from that job's port,
        whatever their addresses. Replies and neighbour discovery pass (as on a NAT job's veth); the rest is dropped."""
        cfg = self.cfg
        if not cfg.bridge_range or cfg.allow_job_to_host:
            return []
        from_jobs = [_meta("iifname", cfg.ovs_bridge_name),
                     {"match": {"op": "==", "left": _payload("ether", "saddr"), "right": f"@{OVS_JOBS}"}}]
        neighbour_discovery = {"match": {"op": "==", "left": _payload("icmpv6", "type"),
                                         "right": {"set": ["nd-neighbor-solicit", "nd-neighbor-advert"]}}}
        return [self._rule("inp", *from_jobs, _ct_state("established", "related"), {"accept": None}),
                self._rule("inp", *from_jobs, neighbour_discovery, {"accept": None}),
                self._rule("inp", *from_jobs, {"drop": None})]

    def _ovs_job_element(self, verb: str, names: JobNames, set_name: str = OVS_JOBS) -> dict:
        elem = {"elem": {"val": names.job_mac, "comment": names.host_if}} if verb == "add" else names.job_mac
        return {verb: {"element": {**self.t, "name": set_name, "elem": [elem]}}}

    def _dns_job(self, plan: JobNetwork, names: JobNames) -> list[dict]:
        if not dns_allowed(self.cfg, plan):
            return []
        t, j = self.t, names.nft_id
        cmds: list[dict] = []
        for mapname, suffix in DNS_MAPS.items():
            cmds += [{"add": {"chain": {**t, "name": f"{j}_{suffix}"}}},
                     {"flush": {"chain": {**t, "name": f"{j}_{suffix}"}}}]
            if suffix == "dout":
                cmds += self._dns_rate_limited(f"{j}_dout", [], [{"counter": f"{j}_out"}, {"accept": None}])
            else:
                cmds.append(self._rule(f"{j}_din", {"counter": f"{j}_in"}, {"accept": None}))
            cmds.append({"add": {"element": {**t, "name": mapname,
                                             "elem": [[names.host_if, {"goto": {"target": f"{j}_{suffix}"}}]]}}})
        return cmds

    def _dns_bridge_base(self) -> list[dict]:
        """bridge table: a bridged job's queries to the forwarder (and its ARP for the host) may enter the host."""
        if not self.cfg.dns_forward:
            return []
        tb = self.tb
        cmds: list[dict] = [{"add": {"map": {**tb, "name": m, "type": "ifname", "map": "verdict"}}}
                            for m in BR_DNS_MAPS]
        cmds += [{"add": {"chain": {**tb, "name": "outp", "type": "filter", "hook": "output", "prio": 0,
                                    "policy": "accept"}}},
                 {"flush": {"chain": {**tb, "name": "outp"}}},
                 self._rule("inp", {"vmap": {"key": {"meta": {"key": "iifname"}}, "data": "@br_dns_from_job"}},
                            t=tb),
                 # The route to the forwarder goes via the host's address: the job must resolve its MAC (the
                 # pre chain already pinned the ARP sender to the job's own address and MAC).
                 self._rule("inp", _meta("iifname", WILDCARD), _meta("protocol", "arp"), {"accept": None}, t=tb),
                 self._rule("outp", {"vmap": {"key": {"meta": {"key": "oifname"}}, "data": "@br_dns_to_job"}},
                            t=tb)]
        return cmds

    def _dns_bridge_job(self, plan: JobNetwork, names: JobNames) -> list[dict]:
        if not dns_allowed(self.cfg, plan):
            return []
        tb, j = self.tb, names.nft_id
        mark = {"mangle": {"key": {"meta": {"key": "mark"}}, "value": DNS_MARK}}
        cmds: list[dict] = []
        for suffix in BR_DNS_MAPS.values():
            cmds += [{"add": {"chain": {**tb, "name": f"{j}_{suffix}"}}},
                     {"flush": {"chain": {**tb, "name": f"{j}_{suffix}"}}}]
        # Other frames return to `inp`, whose catch-all drop keeps the rest of the host closed.
        cmds += self._dns_rate_limited(f"{j}_bdout", [_meta("protocol", "ip"), *self._dns_match("daddr")],
                                       [{"counter": f"{j}_out"}, mark, {"accept": None}], t=tb)
        cmds.append(self._rule(f"{j}_bdin", _meta("protocol", "ip"), *self._dns_match("saddr"),
                               {"counter": f"{j}_in"}, t=tb))
        for mapname, suffix in BR_DNS_MAPS.items():
            cmds.append({"add": {"element": {**tb, "name": mapname,
                                             "elem": [[names.host_if, {"jump": {"target": f"{j}_{suffix}"}}]]}}})
        return cmds

    # -- IPv6 autoconfiguration (lark/kernel/ipv6auto.py) -------------------------------------------------
    def _ra_guard_bridge(self) -> list[dict]:
        """First in the bridge's `pre`: no job port may act as a router or DHCPv6 server for the others."""
        tb = self.tb
        return [self._rule("pre", _meta("iifname", WILDCARD), {"match": {"op": "==", "left": _payload("icmpv6", "type"),
                           "right": {"set": ["nd-router-advert", "nd-redirect"]}}}, {"drop": None}, t=tb),
                self._rule("pre", _meta("iifname", WILDCARD), _meta("protocol", "ip6"), _meta("l4proto", "udp"),
                           {"match": {"op": "==", "left": _payload("th", "sport"), "right": 547}}, {"drop": None},
                           t=tb)]

    def _rs_before_address(self) -> list[dict]:
        """While larkd waits for a SLAAC or DHCPv6 address (the job is not running yet), its port may solicit a
        router and, with DHCPv6, send DHCPv6 client messages, from a link-local address."""
        if self.cfg.bridge_ipv6 not in ("slaac", "dhcpv6"):
            return []
        link_local = {"match": {"op": "==", "left": _payload("ip6", "saddr"),
                                "right": {"prefix": {"addr": "fe80::", "len": 10}}}}
        rules = [self._rule("pre", _meta("iifname", WILDCARD), _meta("protocol", "ip6"), link_local,
                            {"match": {"op": "==", "left": _payload("icmpv6", "type"), "right": "nd-router-solicit"}},
                            {"accept": None}, t=self.tb)]
        if self.cfg.bridge_ipv6 == "dhcpv6":
            rules.append(self._rule("pre", _meta("iifname", WILDCARD), _meta("protocol", "ip6"), link_local,
                                    _meta("l4proto", "udp"),
                                    {"match": {"op": "==", "left": _payload("th", "sport"), "right": 546}},
                                    {"match": {"op": "==", "left": _payload("th", "dport"), "right": 547}},
                                    {"accept": None}, t=self.tb))
        return rules

    def _bridge_base(self) -> list[dict]:
        tb = self.tb
        cmds: list[dict] = [{"add": {"table": {"family": "bridge", "name": self.table}}}]
        for name in BR_MAPS:
            cmds.append({"add": {"map": {**tb, "name": name, "type": "ifname", "map": "verdict"}}})
        for name, hook, prio in (("pre", "prerouting", -300), ("fwd", "forward", 0), ("inp", "input", 0)):
            cmds.append({"add": {"chain": {**tb, "name": name, "type": "filter", "hook": hook, "prio": prio,
                                           "policy": "accept"}}})
            cmds.append({"flush": {"chain": {**tb, "name": name}}})
        cmds += self._dns_bridge_base() + self._ra_guard_bridge()
        cmds += [
            # Frames from a job port go through its anti-spoofing chain; ports Lark does not know are dropped.
            self._rule("pre", {"vmap": {"key": {"meta": {"key": "iifname"}}, "data": "@br_pre"}}, t=tb),
            # A port gets its map entry once its address is known; before that, while larkd runs DHCP for
            # it (the job is not running yet), only untagged DHCP client messages may leave it.
            self._rule("pre", _meta("iifname", WILDCARD), _ether_type("ip"),
                       {"match": {"op": "==", "left": _payload("ip", "saddr"), "right": "0.0.0.0"}},
                       {"match": {"op": "==", "left": _payload("udp", "sport"), "right": 68}},
                       {"match": {"op": "==", "left": _payload("udp", "dport"), "right": 67}},
                       {"accept": None}, t=tb),
            *self._rs_before_address(),
            self._rule("pre", _meta("iifname", WILDCARD), {"drop": None}, t=tb),
            # Counting chains return, so a frame between two jobs is counted for both.
            self._rule("fwd", {"vmap": {"key": {"meta": {"key": "iifname"}}, "data": "@br_out"}}, t=tb),
            self._rule("fwd", {"vmap": {"key": {"meta": {"key": "oifname"}}, "data": "@br_in"}}, t=tb),
        ]
        if not self.cfg.allow_job_to_host:
            cmds.append(self._rule("inp", _meta("iifname", WILDCARD), {"drop": None}, t=tb))
        return cmds

    def _bridge_job(self, plan: JobNetwork, names: JobNames) -> list[dict]:
        tb, j = self.tb, names.nft_id
        cmds: list[dict] = [{"add": {"counter": {**tb, "name": f"{j}_in"}}},
                            {"add": {"counter": {**tb, "name": f"{j}_out"}}}]
        for suffix in ("bpre", "bout", "bin"):
            cmds.append({"add": {"chain": {**tb, "name": f"{j}_{suffix}"}}})
            cmds.append({"flush": {"chain": {**tb, "name": f"{j}_{suffix}"}}})
        cmds += [self._rule(f"{j}_bpre", *r, t=tb) for r in bridge_allowlist(plan, names.job_mac)]
        cmds += [
            self._rule(f"{j}_bout", _meta("protocol", {"set": ["ip", "ip6"]}), {"counter": f"{j}_out"}, t=tb),
            self._rule(f"{j}_bin", _meta("protocol", {"set": ["ip", "ip6"]}), {"counter": f"{j}_in"}, t=tb),
        ]
        for mapname, suffix in BR_MAPS.items():
            verdict = "goto" if suffix == "bpre" else "jump"
            cmds.append({"add": {"element": {**tb, "name": mapname,
                                             "elem": [[names.host_if, {verdict: {"target": f"{j}_{suffix}"}}]]}}})
        cmds += self._dns_bridge_job(plan, names)
        # With br_netfilter loaded, bridged IP also crosses the inet hooks: let the job's port through there
        # (the bridge table above already filtered it) instead of hitting the unknown-job-interface drops.
        for mapname in MAPS:
            cmds.append({"add": {"element": {**self.t, "name": mapname,
                                             "elem": [[names.host_if, {"accept": None}]]}}})
        return cmds

    # -- shared objects -------------------------------------------------------------------------------
    def ensure_base(self) -> None:
        cfg = self.cfg
        t = self.t
        cmds: list[dict] = [{"add": {"table": {"family": "inet", "name": self.table}}}]
        if self.base_present():
            # Rebuild the base chains from config but keep maps, per-job chains and counters intact.
            for chain in ("pre", "fwd", "inp", "nat_pre", "nat_post"):
                cmds.append({"flush": {"chain": {**t, "name": chain}}})
        for name in MAPS:
            cmds.append({"add": {"map": {**t, "name": name, "type": "ifname", "map": "verdict"}}})
        cmds.append({"add": {"map": {**t, "name": "inbound", "type": "inet_service", "map": "ipv4_addr"}}})
        cmds.append({"add": {"set": {**t, "name": OVS_JOBS, "type": "ether_addr"}}})
        chains = [("pre", "filter", "prerouting", -300), ("fwd", "filter", "forward", 0),
                  ("inp", "filter", "input", 0), ("nat_pre", "nat", "prerouting", -100),
                  ("nat_post", "nat", "postrouting", 100)]
        for name, ctype, hook, prio in chains:
            cmds.append({"add": {"chain": {**t, "name": name, "type": ctype, "hook": hook, "prio": prio,
                                           "policy": "accept"}}})
        cmds += self._dns_base() + self._ovs_host_guard()
        drop = {"drop": None}
        cmds += [
            self._rule("pre", {"vmap": {"key": {"meta": {"key": "iifname"}}, "data": "@pre_from_job"}}),
            self._rule("pre", _meta("iifname", WILDCARD), drop),
            self._rule("fwd", {"vmap": {"key": {"meta": {"key": "iifname"}}, "data": "@fwd_from_job"}}),
            self._rule("fwd", {"vmap": {"key": {"meta": {"key": "oifname"}}, "data": "@fwd_to_job"}}),
            self._rule("fwd", _meta("iifname", WILDCARD), drop),
            self._rule("fwd", _meta("oifname", WILDCARD), drop),
        ]
        if forwarding.lark_only(cfg):
            # The host routes for Lark's jobs only (their interfaces were dispatched above), not for anyone.
            cmds.append(self._rule("fwd", _ct_state("established", "related"), {"accept": None}))
            if cfg.bridge_range:
                # With br_netfilter, frames bridged across Lark's bridge cross this hook with the bridge as
                # both devices; the bridge table filters them (job ports) or they are the site's own.
                cmds.append(self._rule("fwd", _meta("iifname", cfg.bridge_name), _meta("oifname", cfg.bridge_name),
                                       {"accept": None}))
            cmds.append(self._rule("fwd", drop))
        cmds += [
            self._rule("inp", _meta("iifname", WILDCARD), _ct_state("established", "related"), {"accept": None}),
            # Neighbour discovery with the gateway address on the host end of the veth (IPv6's ARP).
            self._rule("inp", _meta("iifname", WILDCARD), {"match": {"op": "==", "left": _payload("icmpv6", "type"),
                       "right": {"set": ["nd-neighbor-solicit", "nd-neighbor-advert", "nd-router-solicit"]}}},
                       {"accept": None}),
        ]
        if not cfg.allow_job_to_host:
            cmds.append(self._rule("inp", _meta("iifname", WILDCARD), drop))
        cmds += [
            self._rule("nat_pre", _meta("iifname", cfg.uplink), _meta("nfproto", "ipv4"),
                       {"match": {"op": "==", "left": {"meta": {"key": "l4proto"}},
                                  "right": {"set": ["tcp", "udp"]}}},
                       {"dnat": {"family": "ip", "addr": {"map": {
                           "key": {"payload": {"protocol": "th", "field": "dport"}}, "data": "@inbound"}}}}),
            self._rule("nat_post", _meta("oifname", cfg.uplink),
                       {"match": {"op": "==", "left": {"payload": {"protocol": "ip", "field": "saddr"}},
                                  "right": {"prefix": {"addr": str(cfg.network.network_address),
                                                       "len": cfg.network.prefixlen}}}},
                       {"masquerade": None}),
        ]
        if cfg.subnet6:
            net6 = ipaddress.IPv6Network(cfg.subnet6)
            cmds.append(self._rule("nat_post", _meta("oifname", cfg.uplink),
                                   {"match": {"op": "==", "left": _payload("ip6", "saddr"),
                                              "right": {"prefix": {"addr": str(net6.network_address),
                                                                   "len": net6.prefixlen}}}},
                                   {"masquerade": None}))
        self._dns_rate_set()
        self._apply(cmds, f"nft table inet {self.table}")

    def _dns_rate_set(self) -> None:
        """The OVS jobs' DNS rate set, before the base rules that update it. In nft's text syntax because the set
        must be declared `dynamic`: the rule that updates it makes it so, and nft 1.0.6's JSON has no such flag, so
        an `add set` without it on larkd's restart failed with "File exists" and larkd could not start."""
        if not self.cfg.dns_forward:
            return
        rc, _, err = libnft.get().run(
            f"add table inet {self.table}\n"
            f"add set inet {self.table} {OVS_DNS_RATE} "
            "{ type ether_addr; flags dynamic,timeout; timeout 60s; size 65536; }")
        if rc != 0:
            raise LarkError(f"nft failed: {err.strip()[:500]}", obj=f"nft set inet {self.table} {OVS_DNS_RATE}")

    def ensure_bridge_base(self) -> None:
        """The bridge table's base chains, which drop every frame from a job port that has no rules yet except
        DHCP client messages. Called once the bridge exists and before a job's port joins it: a bridge-family
        table made before the netns' first bridge device sees no frames (verified on kernel 6.18)."""
        if not self._bridge_base_done:
            self._apply(self._bridge_base(), f"nft table bridge {self.table}")
            self._bridge_base_done = True

    def _tables(self) -> list[str]:
        return [o["table"]["family"] for o in self._list("tables") if "table" in o
                and o["table"].get("name") == self.table and o["table"].get("family") in ("inet", "bridge", "netdev")]

    def destroy_base(self) -> None:
        self._bridge_base_done = False
        for family in self._tables():
            self._apply([{"delete": {"table": {"family": family, "name": self.table}}}],
                        f"nft table {family} {self.table}")

    def base_present(self) -> bool:
        return bool({"inet", "bridge"} & set(self._tables()))   # the netdev table (same_ep.py) is per job

    # -- per job --------------------------------------------------------------------------------------
    def add_job(self, plan: JobNetwork, names: JobNames, rules: str) -> None:
        if rules == SWITCHED:
            # Switched by OVS, outside netfilter: its rules are OpenFlow (attach/ovs.py). The host guard only needs
            # its MAC, in before the job runs.
            self._apply(self._ovs_job(plan, names), f"nft sets {OVS_JOBS}, {OVS_DNS_JOBS} (host guard, DNS) entries "
                                                    f"of job {plan.job_id} ({names.host_if})")
            return
        if rules == BRIDGED:
            what = f"nft bridge rules of job {plan.job_id} ({names.host_if})"
            if self._bridge_base_done:
                try:
                    self._apply(self._bridge_job(plan, names), what)
                    return
                except LarkError:
                    log.warning("bridge table %s was missing or changed; rebuilding its base", self.table)
            self._apply(self._bridge_base() + self._bridge_job(plan, names), what)
            self._bridge_base_done = True
            return
        self._apply(self._nat_job(plan, names), f"nft rules of job {plan.job_id} ({names.host_if})")

    def job_cmds(self, plan: JobNetwork, names: JobNames, rules: str) -> list[dict]:
        """The commands add_job applies for this job (without the bridge table's base): what verify_job reads back."""
        if rules == SWITCHED:
            return self._ovs_job(plan, names)
        if rules == BRIDGED:
            return self._bridge_job(plan, names)
        return self._nat_job(plan, names)

    def verify_job(self, plan: JobNetwork, names: JobNames, rules: str) -> list[Finding]:
        return nftverify.verify_cmds(self.job_cmds(plan, names, rules))

    def _ovs_job(self, plan: JobNetwork, names: JobNames) -> list[dict]:
        elements = [self._ovs_job_element("add", names)]
        if dns_allowed(self.cfg, plan):
            elements.append(self._ovs_job_element("add", names, OVS_DNS_JOBS))
        return elements

    def _nat_job(self, plan: JobNetwork, names: JobNames) -> list[dict]:
        cfg, t, j = self.cfg, self.t, names.nft_id
        c_in, c_out = f"{j}_in", f"{j}_out"
        est = _ct_state("established", "related")
        cmds: list[dict] = [
            {"add": {"counter": {**t, "name": c_in}}},
            {"add": {"counter": {**t, "name": c_out}}},
        ]
        for suffix in ("pre", "out", "in"):
            cmds.append({"add": {"chain": {**t, "name": f"{j}_{suffix}"}}})
            cmds.append({"flush": {"chain": {**t, "name": f"{j}_{suffix}"}}})
        # Anti-spoofing: only the job's own addresses may enter the host from its veth (and, for IPv6, its
        # link-local and unspecified sources, which neighbour discovery needs). A family it has none of is
        # dropped whole.
        cmds += self._antispoof(f"{j}_pre", plan)
        # Each direction: replies pass, new connections through the uplink when allowed, counted.
        for chain, new_allowed, dev, counter in ((f"{j}_out", plan.outbound, "oifname", c_out),
                                                 (f"{j}_in", plan.inbound, "iifname", c_in)):
            cmds.append(self._rule(chain, est, {"counter": counter}, {"accept": None}))
            if new_allowed:
                cmds.append(self._rule(chain, _meta(dev, cfg.uplink), _ct_state("new"), {"counter": counter},
                                       {"accept": None}))
            if cfg.allow_job_to_job:
                cmds.append(self._rule(chain, _meta(dev, WILDCARD), {"counter": counter}, {"accept": None}))
            cmds.append(self._rule(chain, {"drop": None}))
        for mapname, suffix in MAPS.items():
            cmds.append({"add": {"element": {**t, "name": mapname,
                                             "elem": [[names.host_if, {"goto": {"target": f"{j}_{suffix}"}}]]}}})
        if plan.inbound and plan.inbound_port:
            cmds.append({"add": {"element": {**t, "name": "inbound", "elem": [[plan.inbound_port, plan.ipv4]]}}})
        cmds += self._dns_job(plan, names)
        return cmds

    def _table_objs(self) -> list[tuple[dict, list[dict]]]:
        """(table selector, listing) for each of Lark's tables that exists."""
        out = []
        for family in self._tables():
            t = (self.t if family == "inet" else self.tb if family == "bridge"
                 else {"family": family, "table": self.table})
            out.append((t, self._list("table", family, self.table)))
        return out

    def remove_job(self, names: JobNames) -> Counters | None:
        j = names.nft_id
        final, found = Counters(), False
        cmds: list[dict] = []
        guard: list[dict] = []  # an OVS job's only object here: its MAC in the host guard's set
        # One listing per table serves both the final counter reading and the delete batch.
        for t, objs in self._table_objs():
            for set_name in (OVS_JOBS, OVS_DNS_JOBS):
                if t is self.t and names.job_mac in {mac for mac, _ in self._ovs_elements(objs, set_name)}:
                    guard.append(self._ovs_job_element("delete", names, set_name))
            for o in objs:
                m = o.get("map")
                if m and m.get("name") in ALL_MAPS:
                    for key, _ in m.get("elem", []):
                        if key == names.host_if:
                            cmds.append({"delete": {"element": {**t, "name": m["name"], "elem": [key]}}})
                if m and m.get("name") == "inbound":
                    addrs = self._job_addresses(objs, j)
                    for key, addr in m.get("elem", []):
                        if addr in addrs:
                            cmds.append({"delete": {"element": {**t, "name": "inbound", "elem": [key]}}})
            chains = [o["chain"]["name"] for o in objs if "chain" in o and o["chain"]["name"].startswith(j + "_")
                      and o["chain"]["name"][len(j) + 1:] in JOB_CHAINS]
            cmds += [{"flush": {"chain": {**t, "name": c}}} for c in chains]
            cmds += [{"delete": {"chain": {**t, "name": c}}} for c in chains]
            for o in objs:
                c = o.get("counter")
                if c and c["name"] in (f"{j}_in", f"{j}_out"):
                    found = True
                    if c["name"].endswith("_in"):
                        final.bytes_in += c["bytes"]
                        final.packets_in += c["packets"]
                    else:
                        final.bytes_out += c["bytes"]
                        final.packets_out += c["packets"]
                    cmds.append({"delete": {"counter": {**t, "name": c["name"]}}})
        if not cmds and not guard:
            return None
        self._apply(guard + cmds, f"nft rules of {names.host_if}")
        if not cmds:
            return None  # an OVS job: its counters are its veth's
        return final if found else Counters()

    @staticmethod
    def _ovs_elements(objs: list[dict], set_name: str = OVS_JOBS) -> list[tuple[str, str]]:
        """(MAC, comment) of each element of an OVS jobs' set in a table listing."""
        out = []
        for o in objs:
            s = o.get("set")
            if s and s.get("name") == set_name:
                for e in s.get("elem", []):
                    e = e.get("elem", e) if isinstance(e, dict) else {"val": e}
                    out.append((str(e.get("val", "")).lower(), str(e.get("comment", ""))))
        return out

    @staticmethod
    def _job_addresses(objs: list[dict], j: str) -> set[str]:
        # The anti-spoofing rule of the job's pre chain names its address.
        out = set()
        for o in objs:
            r = o.get("rule")
            if r and r.get("chain") == f"{j}_pre":
                for e in r.get("expr", []):
                    m = e.get("match")
                    if m and m.get("op") == "!=" and isinstance(m.get("right"), str):
                        out.add(m["right"])
        return out

    def read_counters(self) -> dict[str, Counters]:
        # One netlink dump for every job, both tables (nftcounters.py says why not libnftables).
        out: dict[str, Counters] = {}
        for (family, name), (nbytes, npackets) in nftcounters.dump(self.table).items():
            if family not in nftcounters.LARK_FAMILIES or not name.startswith(NFT_JOB_PREFIX):
                continue
            base, _, direction = name.rpartition("_")
            cur = out.setdefault(base[len(NFT_JOB_PREFIX):], Counters())
            if direction == "in":
                cur.bytes_in += nbytes
                cur.packets_in += npackets
            elif direction == "out":
                cur.bytes_out += nbytes
                cur.packets_out += npackets
        return out

    def job_keys(self) -> set[str]:
        keys = set()
        for _, objs in self._table_objs():
            keys |= {key for set_name in (OVS_JOBS, OVS_DNS_JOBS) for _, host_if in self._ovs_elements(objs, set_name)
                     if (key := key_from_host_if(host_if))}
            for o in objs:
                for kind in ("chain", "counter"):
                    name = o.get(kind, {}).get("name", "")
                    if name.startswith(NFT_JOB_PREFIX):
                        keys.add(name[len(NFT_JOB_PREFIX):].rpartition("_")[0])
                m = o.get("map")
                if m and m.get("name") in ALL_MAPS:
                    for key, _ in m.get("elem", []):
                        if isinstance(key, str) and (job_key := key_from_host_if(key)):
                            keys.add(job_key)
        return keys
