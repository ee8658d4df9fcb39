"""The OpenFlow pipeline every switch runs, as plain data: its tables, the metadata layout, the flow spec, and the
job ad that policies and WAN groups select by. The lowest module of the controller: the policy compiler
(lark.controller.flows), the WAN groups (lark.controller.wan) and the same-EP hairpin build on it.

Pipeline (OpenFlow 1.3, four tables; the metadata register carries the source job's tags between them):
  table 0  SOURCE  per job: tag its packets by MAC (and its own IPv4 source: anti-spoofing), or drop a blocked job
  table 1  SLICE   per sliced job: only packets tagged with the same slice reach its MAC
  table 2  WAN     per policy (not per job): tagged IP traffic to a non-site destination is dropped or steered
  table 3  FORWARD NORMAL switching (issue 12 puts per-group meters in front of it)
Metadata layout: bits 0-31 slice id (0 = not sliced / not a job), bits 32-39 WAN action (0 none, 1 drop,
2+i steer out wan_ports[i]); bits 40-55 are left for the accounting-group id of issue 12.
"""
from __future__ import annotations

from dataclasses import dataclass

import classad2

from .model import JobReg

T_SOURCE, T_SLICE, T_WAN, T_FORWARD = 0, 1, 2, 3
SLICE_MASK = 0xFFFFFFFF
WAN_SHIFT = 32
WAN_MASK = 0xFF << WAN_SHIFT
WAN_DROP = 1
ETH_IP, ETH_IP6 = 0x0800, 0x86DD


@dataclass(frozen=True, slots=True)   # five per job, 100,000 jobs: no __dict__ each
class Flow:
    table: int
    priority: int
    match: tuple            # sorted (field, value) pairs in os-ken OFPMatch names; masked values are (value, mask)
    action: tuple           # ("drop",) | ("goto", table, metadata, mask) | ("normal",) | ("output", port_name)

    def describe(self) -> str:
        m = ",".join(f"{k}={v}" for k, v in self.match)
        return f"table={self.table} priority={self.priority} {m or '*'} -> {' '.join(map(str, self.action))}"


def job_ad(job: JobReg) -> classad2.ClassAd:
    """The job ad the policies see: the attributes larkd forwarded, then the fields it always sends."""
    ad = classad2.ClassAd()
    for k, v in job.attrs.items():
        ad[k] = v
    ad["Owner"] = job.owner
    if job.accounting_group:
        ad["AcctGroup"] = job.accounting_group
        ad.setdefault("AccountingGroup", job.accounting_group)
    ad["RequestBandwidth"] = job.request_bandwidth_mbit
    ad["LarkExecutionPoint"] = job.ep
    ad["LarkJobId"] = job.job_id
    return ad


def selected(expr: classad2.ExprTree, ad: classad2.ClassAd) -> bool:
    """Whether a policy's or WAN group's `select` expression picks the job: undefined or an error picks nothing."""
    try:
        return expr.eval(ad) is True
    except Exception:
        return False
