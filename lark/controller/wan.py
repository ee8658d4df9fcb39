"""WAN bandwidth per accounting group at the core switch (issue 12): OpenFlow 1.3 meters, one per group.

Config ([[wan_group]] sections, first match wins, then [wan] unmatched):
  [[wan_group]]  name = "cms"  select = 'AcctGroup =?= "cms"'  rate_mbit = 250
  [[wan_group]]  name = "other"  select = 'true'  rate_mbit = 100      # a catch-all group is "everyone else"
  [wan] unmatched = "pass" | "drop"       # jobs no group selects: WAN traffic unlimited, or dropped

Mechanism (docs/controller.md "WAN bandwidth per accounting group"):
- meter id = METER_BASE + the group's index in the file; Lark owns exactly the ids in [METER_BASE, METER_END)
  and never touches another meter. Band: drop above rate_mbit, burst = 25% of the rate (kbit).
- per job: ONE flow per address in table 3 (FORWARD), `ip(v6)_src=<job address> -> meter:<group>, NORMAL`, under
  the job's cookie (so it leaves with the job's other flows and is reconciled with them).
- per switch (base cookie, not per job): site destinations go to NORMAL before the per-job meter flows, so only
  WAN-bound traffic is metered. Traffic a wan_steer policy sends out an alternate port leaves in table 2 and is
  not metered (the meter governs the normal WAN exit).
- a meter is created before the first flow that names it (a group's first job) and deleted after the last flow
  that names it is gone (OVS deletes the flows that name a deleted meter).
"""
from __future__ import annotations

import ipaddress
import logging
import threading
import time
from dataclasses import dataclass, field

import classad2

from ..errors import LarkError
from .flows import ETH_IP, ETH_IP6, T_FORWARD, Flow, _selected, job_ad
from .model import JobReg

log = logging.getLogger("lark.controller.wan")

METER_BASE = 0x4C00          # "L": Lark's meters are METER_BASE .. METER_END-1; others are the site's own
METER_END = 0x5000
BURST_FRACTION = 0.25        # verified on the userspace datapath (ARCHITECTURE.md): 25% of the rate polices well
UNMATCHED = ("pass", "drop")
P_SITE, P_JOB = 160, 150     # table 3 priorities: site destinations first, then the per-job meter flows


@dataclass
class WanGroup:
    name: str
    select: str              # ClassAd expression over the job ad (the same ad as the [[policy]] sections see)
    rate_mbit: float

    def expr(self) -> classad2.ExprTree:
        return classad2.ExprTree(self.select)

    @property
    def rate_kbps(self) -> int:
        return max(1, round(self.rate_mbit * 1000))

    @property
    def burst_kbit(self) -> int:
        return max(1, round(self.rate_kbps * BURST_FRACTION))


def parse_groups(items: object) -> list[WanGroup]:
    """The [[wan_group]] sections, validated: each error names the group and the fix."""
    if not isinstance(items, list):
        raise LarkError("wan_group must be an array of tables", obj="controller config",
                        fix="write each group as a [[wan_group]] section")
    groups, names = [], set()
    for i, g in enumerate(items):
        where = f"[[wan_group]] {g.get('name', i + 1)!r}" if isinstance(g, dict) else f"[[wan_group]] {i + 1}"
        if not isinstance(g, dict) or set(g) - {"name", "select", "rate_mbit"} or not {"name", "select",
                                                                                    "rate_mbit"} <= set(g):
            raise LarkError(f"{where} must have exactly name, select and rate_mbit", obj="controller config",
                            fix='e.g. name = "cms", select = \'AcctGroup =?= "cms"\', rate_mbit = 250')
        rate = g["rate_mbit"]
        if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not 0 < rate <= 4_000_000:
            raise LarkError(f"{where} has rate_mbit = {rate!r}", obj="controller config",
                            fix="give the group's WAN rate in Mbit/s, a positive number")
        if g["name"] in names:
            raise LarkError(f"{where} is defined twice", obj="controller config", fix="give each group its own name")
        names.add(g["name"])
        grp = WanGroup(str(g["name"]), str(g["select"]), float(rate))
        try:
            grp.expr()
        except Exception as e:
            raise LarkError(f"{where}: select = {grp.select!r} is not a ClassAd expression ({e})",
                            obj="controller config", fix="write e.g. select = 'AcctGroup =?= \"cms\"'") from None
        groups.append(grp)
    if len(groups) > METER_END - METER_BASE:
        raise LarkError(f"{len(groups)} WAN groups", obj="controller config",
                        fix=f"use at most {METER_END - METER_BASE} [[wan_group]] sections")
    return groups


def check_unmatched(value: str) -> str:
    if value not in UNMATCHED:
        raise LarkError(f"[wan] unmatched = {value!r}", obj="controller config",
                        fix='use "pass" (unlimited) or "drop" (no WAN for jobs no [[wan_group]] selects)')
    return value


def meter_id(index: int) -> int:
    return METER_BASE + index


def is_lark_meter(mid: int) -> bool:
    return METER_BASE <= mid < METER_END


class WanPlan:
    """Which group a job is in and the job's metering flows: pure logic, no OpenFlow."""

    def __init__(self, groups: list[WanGroup], unmatched: str = "pass"):
        self.groups = groups
        self.unmatched = check_unmatched(unmatched)
        self._exprs = [g.expr() for g in groups]

    @property
    def active(self) -> bool:
        return bool(self.groups) or self.unmatched == "drop"

    def group_of(self, job: JobReg) -> int | None:
        """Index of the first group whose select is true for the job's ad, else None."""
        ad = job_ad(job)
        for i, e in enumerate(self._exprs):
            if _selected(e, ad):
                return i
        return None

    def job_flows(self, job: JobReg) -> list[Flow]:
        """One flow per job address: into its group's meter, or a drop when unmatched = "drop"."""
        if not self.active:
            return []
        i = self.group_of(job)
        if i is None and self.unmatched == "pass":
            return []
        action = ("meter_normal", meter_id(i)) if i is not None else ("drop",)
        flows = [Flow(T_FORWARD, P_JOB, (("eth_type", ETH_IP), ("ipv4_src", a)), action) for a in job.ipv4]
        flows += [Flow(T_FORWARD, P_JOB, (("eth_type", ETH_IP6), ("ipv6_src", a)), action) for a in job.ipv6]
        return flows

    def base_flows(self, site_prefixes: list[str]) -> list[Flow]:
        """Site destinations bypass the per-job WAN meters (one flow per site prefix, never per job)."""
        if not self.active:
            return []
        flows = []
        for prefix in list(site_prefixes) + ["fe80::/10", "ff00::/8"]:
            net = ipaddress.ip_network(prefix)
            eth, fld = (ETH_IP, "ipv4_dst") if net.version == 4 else (ETH_IP6, "ipv6_dst")
            flows.append(Flow(T_FORWARD, P_SITE, (("eth_type", eth), (fld, (str(net.network_address),
                                                                             str(net.netmask)))), ("normal",)))
        return flows

    @staticmethod
    def meters_in(flows) -> set[int]:
        return {f.action[1] for f in flows if f.action[0] == "meter_normal"}


@dataclass
class MeterSample:
    at: float
    bytes: int
    rate_mbit: float = 0.0


@dataclass
class MeterCounters:
    """Per switch and meter: the last sample and the rate between the last two (polled by the app)."""
    samples: dict[tuple[int, int], MeterSample] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def update(self, dpid: int, mid: int, byte_count: int, now: float | None = None) -> None:
        now = time.time() if now is None else now
        with self.lock:
            old = self.samples.get((dpid, mid))
            rate = 0.0
            if old is not None and now > old.at and byte_count >= old.bytes:
                rate = (byte_count - old.bytes) * 8 / (now - old.at) / 1e6
            self.samples[(dpid, mid)] = MeterSample(now, byte_count, rate)

    def forget(self, dpid: int, mid: int) -> None:
        with self.lock:
            self.samples.pop((dpid, mid), None)

    def status(self, plan: WanPlan, jobs_per_meter: dict[int, int]) -> list[dict]:
        out = []
        with self.lock:
            for i, g in enumerate(plan.groups):
                mid = meter_id(i)
                s = [v for (dp, m), v in self.samples.items() if m == mid]
                out.append({"group": g.name, "meter": mid, "rate_mbit": g.rate_mbit, "jobs": jobs_per_meter.get(mid, 0),
                            "bytes": sum(x.bytes for x in s), "rate_now_mbit": round(sum(x.rate_mbit for x in s), 3)})
        return out
