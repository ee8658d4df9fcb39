"""WAN bandwidth per accounting group at the core switch (issue 12): per (group, WAN port) one OpenFlow 1.3 meter
(policing) or one queue (shaping), as `[wan] mechanism` says.

Config ([[wan_group]] sections, first match wins, then [wan]):
  [[wan_group]]  name = "cms"  select = 'AcctGroup =?= "cms"'  rate_mbit = 250
  [wan_group.port_rate]  wan1 = 100           # optional: the group's rate on that WAN port (others: rate_mbit)
  [[wan_group]]  name = "other"  select = 'true'  rate_mbit = 100      # a catch-all group is "everyone else"
  [wan] unmatched = "pass" | "drop"           # jobs no group selects: WAN traffic unlimited, or dropped
  [wan] mechanism = "meter" | "queue"         # policing by OpenFlow meters (default) or shaping by queues
  [wan] ovsdb = "unix:/var/run/openvswitch/db.sock"   # queue: the OVS whose WAN ports get Lark's queues;
                                              #   "" = the site made the queues itself (Lark only sends set_queue)

Mechanism (docs/controller.md "WAN bandwidth per accounting group"):
- the job's WAN port: wan_ports[0] (the normal exit, NORMAL switching) or the port a wan_steer policy names.
- meter: id = METER_BASE + port index * PORT_STRIDE + group index; Lark owns exactly [METER_BASE, METER_END) and
  never touches another meter. Band: drop above the group's rate on that port, burst = 25% of the rate (kbit).
  queue: queue id = group index + 1 on every WAN port (each port has its own queue, at that port's rate); made by
  lark.controller.wan_queue (OVSDB QoS/Queue rows, tc classification on a userspace datapath).
- per job: ONE flow per address under the job's cookie (it leaves and is reconciled with the job's other flows):
  normal exit: table 3 (FORWARD) `ip(v6)_src=ADDR -> meter:M | set_queue:Q, NORMAL`; steered: table 2 (WAN) at a
  priority above the steering verdict, `ip(v6)_src=ADDR -> meter:M | set_queue:Q, output:PORT`, so steered traffic
  is limited by the group's rate for that port. A job a wan_drop policy selects gets none (it has no WAN).
- per switch (base cookie, not per job): site destinations go to NORMAL before the per-job flows of table 3; in
  table 2 the steering policies' own site flows (priority 300) already come first.
- a limit is created before the first flow that names it (a group's first job on that port) and deleted after the
  last flow that names it is gone (OVS deletes the flows that name a deleted meter).
"""
from __future__ import annotations

import ipaddress
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import classad2

from ..errors import LarkError
from .model import JobReg
from .pipeline import ETH_IP, ETH_IP6, T_FORWARD, T_WAN, Flow, job_ad, selected

log = logging.getLogger("lark.controller.wan")

METER_BASE = 0x4C00          # "L": Lark's meters are METER_BASE .. METER_END-1; others are the site's own
METER_END = 0x5000
PORT_STRIDE = 0x100          # meter id = METER_BASE + port index * PORT_STRIDE + group index
MAX_GROUPS = PORT_STRIDE
MAX_PORTS = (METER_END - METER_BASE) // PORT_STRIDE
BURST_FRACTION = 0.25        # verified on the userspace datapath (ARCHITECTURE.md): 25% of the rate polices well
UNMATCHED = ("pass", "drop")
MECHANISMS = ("meter", "queue")
P_SITE, P_JOB = 160, 150     # table 3 priorities: site destinations first, then the per-job limit flows
P_STEER = 250                # table 2: per-job limit flows of steered jobs, above the steering verdict (200) and
                             # below the steering policies' site flows (300)
LIMIT_ACTIONS = ("meter_normal", "meter_output", "queue_normal", "queue_output")
GROUP_KEYS = {"name", "select", "rate_mbit", "port_rate"}


def _rate(value: object) -> bool:
    return not isinstance(value, bool) and isinstance(value, (int, float)) and 0 < value <= 4_000_000


@dataclass
class WanGroup:
    name: str
    select: str              # ClassAd expression over the job ad (the same ad as the [[policy]] sections see)
    rate_mbit: float         # on every WAN port not in port_rates
    port_rates: dict[str, float] = field(default_factory=dict)   # WAN port name -> Mbit/s there

    def expr(self) -> classad2.ExprTree:
        return classad2.ExprTree(self.select)

    def rate_on(self, port: str) -> float:
        return self.port_rates.get(port, self.rate_mbit)

    def rate_kbps(self, port: str) -> int:
        return max(1, round(self.rate_on(port) * 1000))

    def burst_kbit(self, port: str) -> int:
        return max(1, round(self.rate_kbps(port) * BURST_FRACTION))


def parse_groups(items: object) -> list[WanGroup]:
    """The [[wan_group]] sections, validated: each error names the group and the fix."""
    if not isinstance(items, list):
        raise LarkError("wan_group must be an array of tables", obj="controller config",
                        fix="write each group as a [[wan_group]] section")
    groups, names = [], set()
    for i, g in enumerate(items):
        where = f"[[wan_group]] {g.get('name', i + 1)!r}" if isinstance(g, dict) else f"[[wan_group]] {i + 1}"
        if not isinstance(g, dict) or set(g) - GROUP_KEYS or not {"name", "select", "rate_mbit"} <= set(g):
            raise LarkError(f"{where} must have name, select and rate_mbit (and optionally port_rate)",
                            obj="controller config",
                            fix='e.g. name = "cms", select = \'AcctGroup =?= "cms"\', rate_mbit = 250')
        rate = g["rate_mbit"]
        if not _rate(rate):
            raise LarkError(f"{where} has rate_mbit = {rate!r}", obj="controller config",
                            fix="give the group's WAN rate in Mbit/s, a positive number")
        port_rate = g.get("port_rate", {})
        if not isinstance(port_rate, dict) or not all(isinstance(k, str) and _rate(v) for k, v in port_rate.items()):
            raise LarkError(f"{where} has port_rate = {port_rate!r}", obj="controller config",
                            fix="write [wan_group.port_rate] under the group, one line per WAN port: wan1 = 100")
        if g["name"] in names:
            raise LarkError(f"{where} is defined twice", obj="controller config", fix="give each group its own name")
        names.add(g["name"])
        grp = WanGroup(str(g["name"]), str(g["select"]), float(rate), {k: float(v) for k, v in port_rate.items()})
        try:
            grp.expr()
        except Exception as e:
            raise LarkError(f"{where}: select = {grp.select!r} is not a ClassAd expression ({e})",
                            obj="controller config", fix="write e.g. select = 'AcctGroup =?= \"cms\"'") from None
        groups.append(grp)
    if len(groups) > MAX_GROUPS:
        raise LarkError(f"{len(groups)} WAN groups", obj="controller config",
                        fix=f"use at most {MAX_GROUPS} [[wan_group]] sections")
    return groups


def check_unmatched(value: str) -> str:
    if value not in UNMATCHED:
        raise LarkError(f"[wan] unmatched = {value!r}", obj="controller config",
                        fix='use "pass" (unlimited) or "drop" (no WAN for jobs no [[wan_group]] selects)')
    return value


def check_mechanism(value: str) -> str:
    if value not in MECHANISMS:
        raise LarkError(f"[wan] mechanism = {value!r}", obj="controller config",
                        fix='use "meter" (OpenFlow 1.3 meters, policing) or "queue" (queues on the WAN ports, '
                            'shaping)')
    return value


def meter_id(group: int, port: int = 0) -> int:
    return METER_BASE + port * PORT_STRIDE + group


def meter_limit(mid: int) -> tuple[int, int]:
    """(group index, port index) of a Lark meter id."""
    return (mid - METER_BASE) % PORT_STRIDE, (mid - METER_BASE) // PORT_STRIDE


def queue_id(group: int) -> int:
    """The group's queue on every WAN port (0 stays the port's default queue)."""
    return group + 1


def is_lark_meter(mid: int) -> bool:
    return METER_BASE <= mid < METER_END


class WanPlan:
    """Which group a job is in and the job's limit flows: pure logic, no OpenFlow."""

    def __init__(self, groups: list[WanGroup], unmatched: str = "pass", mechanism: str = "meter",
                 wan_ports: list[str] | tuple[str, ...] = ()):
        self.groups = groups
        self.unmatched = check_unmatched(unmatched)
        self.mechanism = check_mechanism(mechanism)
        self.wan_ports = list(wan_ports)
        self._exprs = [g.expr() for g in groups]
        for g in groups:
            unknown = sorted(set(g.port_rates) - set(self.wan_ports))
            if unknown:
                raise LarkError(f"[[wan_group]] {g.name!r} has a port_rate for {unknown}, which are not WAN ports",
                                obj="controller config", fix=f"name ports of [switch] wan_ports: {self.wan_ports}")
        if groups and len(self.wan_ports) > MAX_PORTS:
            raise LarkError(f"{len(self.wan_ports)} WAN ports with [[wan_group]] sections", obj="controller config",
                            fix=f"WAN group limits cover at most {MAX_PORTS} wan_ports")
        if groups and mechanism == "queue" and not self.wan_ports:
            raise LarkError('[wan] mechanism = "queue" needs the WAN ports the queues are on',
                            obj="controller config", fix='set wan_ports = ["wan0"] under [switch]')

    @property
    def active(self) -> bool:
        return bool(self.groups) or self.unmatched == "drop"

    def port_name(self, port: int) -> str:
        return self.wan_ports[port] if port < len(self.wan_ports) else f"WAN port {port}"

    def rate_mbit(self, limit: tuple[int, int]) -> float:
        g, p = limit
        return self.groups[g].rate_on(self.port_name(p))

    def describe(self, limit: tuple[int, int]) -> str:
        """How logs and errors name a limit: group, port and its meter or queue."""
        g, p = limit
        name = self.groups[g].name if 0 <= g < len(self.groups) else "?"
        what = f"meter {meter_id(g, p):#x}" if self.mechanism == "meter" else f"queue {queue_id(g)}"
        return f"{what} (group {name} on {self.port_name(p)})"

    def group_of(self, job: JobReg) -> int | None:
        """Index of the first group whose select is true for the job's ad, else None."""
        ad = job_ad(job)
        for i, e in enumerate(self._exprs):
            if selected(e, ad):
                return i
        return None

    def job_flows(self, job: JobReg, port: int | None = 0) -> list[Flow]:
        """One flow per job address into its group's limit on the job's WAN port (`port`: index into wan_ports, 0
        for the normal exit, None when a wan_drop policy keeps the job off the WAN), or a drop when unmatched =
        "drop"."""
        if not self.active or port is None:
            return []
        i = self.group_of(job)
        if i is None and self.unmatched == "pass":
            return []
        table, prio = (T_FORWARD, P_JOB) if port == 0 else (T_WAN, P_STEER)
        if i is None:
            action: tuple = ("drop",)
        elif self.mechanism == "meter":
            action = ("meter_normal", meter_id(i)) if port == 0 else \
                ("meter_output", meter_id(i, port), self.wan_ports[port])
        else:
            action = ("queue_normal", queue_id(i)) if port == 0 else \
                ("queue_output", queue_id(i), self.wan_ports[port])
        flows = [Flow(table, prio, (("eth_type", ETH_IP), ("ipv4_src", a)), action) for a in job.ipv4]
        flows += [Flow(table, prio, (("eth_type", ETH_IP6), ("ipv6_src", a)), action) for a in job.ipv6]
        return flows

    def base_flows(self, site_prefixes: list[str]) -> list[Flow]:
        """Site destinations bypass the per-job WAN limits (one flow per site prefix, never per job)."""
        if not self.active:
            return []
        flows = []
        for prefix in [*site_prefixes, "fe80::/10", "ff00::/8"]:
            net = ipaddress.ip_network(prefix)
            eth, fld = (ETH_IP, "ipv4_dst") if net.version == 4 else (ETH_IP6, "ipv6_dst")
            flows.append(Flow(T_FORWARD, P_SITE, (("eth_type", eth), (fld, (str(net.network_address),
                                                                             str(net.netmask)))), ("normal",)))
        return flows

    def limits_in(self, flows) -> set[tuple[int, int]]:
        """(group index, port index) of every limit the flows name."""
        out = set()
        for f in flows:
            kind = f.action[0]
            if kind in ("meter_normal", "meter_output"):
                out.add(meter_limit(f.action[1]))
            elif kind == "queue_normal":
                out.add((f.action[1] - 1, 0))
            elif kind == "queue_output":
                out.add((f.action[1] - 1, self.wan_ports.index(f.action[2])))
        return out

    @staticmethod
    def meters_in(flows) -> set[int]:
        return {f.action[1] for f in flows if f.action[0] in ("meter_normal", "meter_output")}

    @staticmethod
    def sources(flow: Flow) -> str | None:
        """The job address a limit flow classifies (its ipv4_src / ipv6_src), else None."""
        if flow.action[0] not in LIMIT_ACTIONS:
            return None
        m = dict(flow.match)
        return m.get("ipv4_src") or m.get("ipv6_src")


@dataclass
class LimitSample:
    at: float
    bytes: int
    rate_mbit: float = 0.0


@dataclass
class LimitCounters:
    """Per switch and limit (group, port): the last sample and the rate between the last two (polled by the app
    from meter stats or queue stats)."""
    samples: dict[tuple[int, tuple[int, int]], LimitSample] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def update(self, dpid: int, limit: tuple[int, int], byte_count: int, now: float | None = None) -> None:
        now = time.time() if now is None else now
        with self.lock:
            old = self.samples.get((dpid, limit))
            rate = 0.0
            if old is not None and now > old.at and byte_count >= old.bytes:
                rate = (byte_count - old.bytes) * 8 / (now - old.at) / 1e6
            self.samples[(dpid, limit)] = LimitSample(now, byte_count, rate)

    def forget(self, dpid: int | None, limit: tuple[int, int]) -> None:
        """Drop a limit's samples on one switch (None: on every switch)."""
        with self.lock:
            for key in [k for k in self.samples if k[1] == limit and dpid in (None, k[0])]:
                del self.samples[key]

    def status(self, plan: WanPlan, jobs_per_limit: dict[tuple[int, int], int]) -> list[dict]:
        """Per group: its limit on the normal exit, jobs, bytes and rate now over all its ports; `ports` the same
        per WAN port (where it has a limit)."""
        out: list[dict[str, Any]] = []
        with self.lock:
            for g, grp in enumerate(plan.groups):
                ports: list[dict[str, Any]] = []
                for p in range(max(1, len(plan.wan_ports))):
                    s = [v for (_, lim), v in self.samples.items() if lim == (g, p)]
                    row: dict[str, Any] = {"port": plan.port_name(p), "rate_mbit": plan.rate_mbit((g, p)),
                           "jobs": jobs_per_limit.get((g, p), 0), "bytes": sum(x.bytes for x in s),
                           "rate_now_mbit": round(sum(x.rate_mbit for x in s), 3)}
                    if plan.mechanism == "meter":
                        row["meter"] = meter_id(g, p)
                    else:
                        row["queue"] = queue_id(g)
                    ports.append(row)
                out.append({"group": grp.name, "mechanism": plan.mechanism, **{k: ports[0][k] for k in (
                    "meter", "queue") if k in ports[0]}, "rate_mbit": grp.rate_mbit,
                    "jobs": sum(r["jobs"] for r in ports), "bytes": sum(r["bytes"] for r in ports),
                    "rate_now_mbit": round(sum(r["rate_now_mbit"] for r in ports), 3), "ports": ports})
        return out
