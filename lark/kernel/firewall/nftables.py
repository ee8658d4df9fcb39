"""nftables backend: Lark owns exactly one table (`inet <nft_table>`) and touches nothing else.

Per-job chains are reached through verdict maps keyed by interface name, so adding or removing a job is a
single atomic transaction of map elements, chains and named counters, with no rule handles to track.
"""
from __future__ import annotations

import ipaddress
import json
import logging

from ...errors import LarkError
from . import libnft
from ...names import HOST_IF_PREFIX, NFT_JOB_PREFIX, JobNames, key_from_host_if
from ...plan import JobNetwork
from .base import Counters, Firewall

log = logging.getLogger(__name__)
WILDCARD = HOST_IF_PREFIX + "*"
MAPS = {"pre_from_job": "pre", "fwd_from_job": "out", "fwd_to_job": "in"}
# Bridge mode: bridged frames never reach the inet hooks (unless br_netfilter is loaded), so bridged jobs get
# their anti-spoofing and counters in a bridge-family table of the same name.
BR_MAPS = {"br_pre": "bpre", "br_out": "bout", "br_in": "bin"}
JOB_CHAINS = ("pre", "out", "in", "bpre", "bout", "bin")


def _payload(proto: str, field: str) -> dict:
    return {"payload": {"protocol": proto, "field": field}}


def _ne(left: dict, right) -> dict:
    return {"match": {"op": "!=", "left": left, "right": right}}


def _meta(key: str, value, op: str = "==") -> dict:
    return {"match": {"op": op, "left": {"meta": {"key": key}}, "right": value}}


def _ct_state(*states: str) -> dict:
    return {"match": {"op": "in", "left": {"ct": {"key": "state"}}, "right": list(states)}}


class NftablesFirewall(Firewall):
    name = "nftables"

    def __init__(self, cfg):
        super().__init__(cfg)
        self.table = cfg.nft_table
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

    def _bridge_base(self) -> list[dict]:
        tb = self.tb
        cmds: list[dict] = [{"add": {"table": {"family": "bridge", "name": self.table}}}]
        for name in BR_MAPS:
            cmds.append({"add": {"map": {**tb, "name": name, "type": "ifname", "map": "verdict"}}})
        for name, hook, prio in (("pre", "prerouting", -300), ("fwd", "forward", 0), ("inp", "input", 0)):
            cmds.append({"add": {"chain": {**tb, "name": name, "type": "filter", "hook": hook, "prio": prio,
                                           "policy": "accept"}}})
            cmds.append({"flush": {"chain": {**tb, "name": name}}})
        cmds += [
            # Frames from a job port go through its anti-spoofing chain; ports Lark does not know are dropped.
            self._rule("pre", {"vmap": {"key": {"meta": {"key": "iifname"}}, "data": "@br_pre"}}, t=tb),
            # A port gets its map entry once its address is known; before that, while larkd runs DHCP for
            # it (the job is not running yet), only DHCP client messages may leave it.
            self._rule("pre", _meta("iifname", WILDCARD), _meta("protocol", "ip"),
                       {"match": {"op": "==", "left": _payload("ip", "saddr"), "right": "0.0.0.0"}},
                       {"match": {"op": "==", "left": _payload("udp", "sport"), "right": 68}},
                       {"match": {"op": "==", "left": _payload("udp", "dport"), "right": 67}},
                       {"accept": None}, t=tb),
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
        ether_arp = _meta("protocol", "arp")
        cmds += [
            self._rule(f"{j}_bpre", _ne(_payload("ether", "saddr"), names.job_mac), {"drop": None}, t=tb),
            *self._antispoof(f"{j}_bpre", plan, t=tb),
            self._rule(f"{j}_bpre", ether_arp, _ne(_payload("arp", "saddr ip"), plan.ipv4 or "0.0.0.0"),
                       {"drop": None}, t=tb),
            self._rule(f"{j}_bpre", ether_arp, _ne(_payload("arp", "saddr ether"), names.job_mac), {"drop": None},
                       t=tb),
            self._rule(f"{j}_bpre", {"accept": None}, t=tb),
            self._rule(f"{j}_bout", _meta("protocol", {"set": ["ip", "ip6"]}), {"counter": f"{j}_out"}, t=tb),
            self._rule(f"{j}_bin", _meta("protocol", {"set": ["ip", "ip6"]}), {"counter": f"{j}_in"}, t=tb),
        ]
        for mapname, suffix in BR_MAPS.items():
            verdict = "goto" if suffix == "bpre" else "jump"
            cmds.append({"add": {"element": {**tb, "name": mapname,
                                             "elem": [[names.host_if, {verdict: {"target": f"{j}_{suffix}"}}]]}}})
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
        chains = [("pre", "filter", "prerouting", -300), ("fwd", "filter", "forward", 0),
                  ("inp", "filter", "input", 0), ("nat_pre", "nat", "prerouting", -100),
                  ("nat_post", "nat", "postrouting", 100)]
        for name, ctype, hook, prio in chains:
            cmds.append({"add": {"chain": {**t, "name": name, "type": ctype, "hook": hook, "prio": prio,
                                           "policy": "accept"}}})
        drop = {"drop": None}
        cmds += [
            self._rule("pre", {"vmap": {"key": {"meta": {"key": "iifname"}}, "data": "@pre_from_job"}}),
            self._rule("pre", _meta("iifname", WILDCARD), drop),
            self._rule("fwd", {"vmap": {"key": {"meta": {"key": "iifname"}}, "data": "@fwd_from_job"}}),
            self._rule("fwd", {"vmap": {"key": {"meta": {"key": "oifname"}}, "data": "@fwd_to_job"}}),
            self._rule("fwd", _meta("iifname", WILDCARD), drop),
            self._rule("fwd", _meta("oifname", WILDCARD), drop),
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
        self._apply(cmds, f"nft table inet {self.table}")

    def _tables(self) -> list[str]:
        return [o["table"]["family"] for o in self._list("tables") if "table" in o
                and o["table"].get("name") == self.table and o["table"].get("family") in ("inet", "bridge")]

    def destroy_base(self) -> None:
        self._bridge_base_done = False
        for family in self._tables():
            self._apply([{"delete": {"table": {"family": family, "name": self.table}}}],
                        f"nft table {family} {self.table}")

    def base_present(self) -> bool:
        return bool(self._tables())

    # -- per job --------------------------------------------------------------------------------------
    def add_job(self, plan: JobNetwork, names: JobNames) -> None:
        if plan.network_type == "ovs_bridge":
            return  # switched by OVS, outside netfilter: its rules are OpenFlow (attach/ovs.py)
        if plan.network_type == "bridge":
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
        self._apply(cmds, f"nft rules of job {plan.job_id} ({names.host_if})")

    def _table_objs(self) -> list[tuple[dict, list[dict]]]:
        """(table selector, listing) for each of Lark's tables that exists."""
        out = []
        for family in self._tables():
            t = self.t if family == "inet" else self.tb
            out.append((t, self._list("table", family, self.table)))
        return out

    def remove_job(self, names: JobNames) -> Counters | None:
        j = names.nft_id
        final, found = Counters(), False
        cmds: list[dict] = []
        # One listing per table serves both the final counter reading and the delete batch.
        for t, objs in self._table_objs():
            for o in objs:
                m = o.get("map")
                if m and m.get("name") in (*MAPS, *BR_MAPS):
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
        if not cmds:
            return None
        self._apply(cmds, f"nft rules of {names.host_if}")
        return final if found else Counters()

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
        out: dict[str, Counters] = {}
        for family in self._tables():
            for o in self._list("counters", "table", family, self.table):
                c = o.get("counter")
                if not c or not c["name"].startswith(NFT_JOB_PREFIX):
                    continue
                base, _, direction = c["name"].rpartition("_")
                cur = out.setdefault(base[len(NFT_JOB_PREFIX):], Counters())
                if direction == "in":
                    cur.bytes_in += c["bytes"]
                    cur.packets_in += c["packets"]
                elif direction == "out":
                    cur.bytes_out += c["bytes"]
                    cur.packets_out += c["packets"]
        return out

    def job_keys(self) -> set[str]:
        keys = set()
        for _, objs in self._table_objs():
            for o in objs:
                for kind in ("chain", "counter"):
                    name = o.get(kind, {}).get("name", "")
                    if name.startswith(NFT_JOB_PREFIX):
                        keys.add(name[len(NFT_JOB_PREFIX):].rpartition("_")[0])
                m = o.get("map")
                if m and m.get("name") in (*MAPS, *BR_MAPS):
                    for key, _ in m.get("elem", []):
                        if isinstance(key, str) and key_from_host_if(key):
                            keys.add(key_from_host_if(key))
        return keys
