"""Rate limits for one job, both directions, with HTB on the two ends of its veth.

Toward the job: HTB on the host-side veth (its egress is what the job receives). From the job: HTB on the
job-side device inside the job's netns. The job cannot remove or change that qdisc: its netns belongs to the
initial user namespace and the job has no CAP_NET_ADMIN there. That saves an IFB device and an ingress
redirect per job, and act_police (not on every kernel) is not needed. Both qdiscs go away with the veth.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass

from pyroute2 import IPRoute
from pyroute2.netlink import NLM_F_CREATE, NLM_F_EXCL, NLM_F_REPLACE
from pyroute2.netlink.exceptions import NetlinkError
from pyroute2.netlink.rtnl import RTM_NEWQDISC, RTM_NEWTCLASS
from pyroute2.netlink.rtnl.tcmsg import sched_htb

from ..errors import LarkError
from .drift import Finding, drifted, present
from .links import host_rtnl

log = logging.getLogger(__name__)

ROOT_HANDLE = 0x10000      # 1:
CLASS_HANDLE = 0x10001     # 1:1, also the default class: every packet is the job's
GSO_MAX = 65536            # veth hands TSO/GSO packets of up to 64 KiB to the qdisc
BURST_TIME = 0.005         # seconds of traffic a bucket may hold
MAX_RATE_MBIT = 10_000_000  # 10 Tbit/s: anything above is a typo, not a NIC
TC_H_ROOT = 0xFFFFFFFF
TC_FIX = ("something other than larkd ran `tc qdisc del/replace` or `tc class change` on the job's device (the job "
          "itself cannot: it has no CAP_NET_ADMIN there)")


@dataclass(frozen=True)
class Limit:
    rate_bit: int          # bit/s
    burst: int             # bytes

    @property
    def mbit(self) -> float:
        return self.rate_bit / 1e6


def burst_for(rate_bit: int) -> int:
    """Bucket size for a rate: 5 ms of traffic, but never less than two GSO packets.

    A bucket smaller than one GSO packet makes HTB run in debt and TCP lose throughput (measured: ~0.5 of
    the limit at 10 Mbit/s with the default mtu-sized burst); one much larger than a few ms of traffic lets
    bursts overshoot the limit on short timescales. Two GSO packets keep TCP at ~0.95 of the limit from
    10 Mbit/s up; 5 ms is what a 10 Gbit/s link needs to stay busy between timer ticks.
    """
    return max(int(rate_bit / 8 * BURST_TIME), 2 * GSO_MAX)


def limit_for(mbit: float, job: str = "?") -> Limit:
    if not (0 < mbit <= MAX_RATE_MBIT):
        raise LarkError(f"bandwidth limit {mbit!r} Mbit/s is out of range", job=job, obj="Bandwidth",
                        fix=f"use a value in (0, {MAX_RATE_MBIT}] Mbit/s")
    rate_bit = int(mbit * 1_000_000)
    return Limit(rate_bit=rate_bit, burst=burst_for(rate_bit))


# pyroute2's flags for the tc commands used here ("add", "add-class", "change-class"), for the raw socket's requests
_COMMAND_FLAGS = {"add": NLM_F_CREATE | NLM_F_EXCL, "add-class": NLM_F_CREATE | NLM_F_EXCL,
                  "change-class": NLM_F_REPLACE}


def _htb(ipr: IPRoute, index: int, limit: Limit) -> None:
    root = {"default": CLASS_HANDLE & 0xFFFF}
    raw = host_rtnl(ipr)
    if raw is not None:  # larkd's setup: its raw socket (a pyroute2 tc request costs ~0.8 ms in Python)
        raw.tc(RTM_NEWQDISC, _COMMAND_FLAGS["add"], index, ROOT_HANDLE, TC_H_ROOT, "htb",
               sched_htb.get_parameters(root))
    else:
        ipr.tc("add", "htb", index=index, handle=ROOT_HANDLE, **root)
    _htb_class(ipr, index, limit, "add-class")


def _htb_class(ipr: IPRoute, index: int, limit: Limit, command: str) -> None:
    # pyroute2 sends TCA_HTB_RATE64/CEIL64 itself for rates of 2^32 bytes/s (34 Gbit/s) and more.
    params = {"rate": f"{limit.rate_bit}bit", "ceil": f"{limit.rate_bit}bit", "burst": limit.burst,
              "cburst": limit.burst, "quantum": min(max(limit.rate_bit // 8 // 10, 1514), 200_000)}
    raw = host_rtnl(ipr)
    if raw is not None:  # the same options, from the same pyroute2 plugin, on the raw socket
        raw.tc(RTM_NEWTCLASS, _COMMAND_FLAGS[command], index, CLASS_HANDLE, ROOT_HANDLE, "htb",
               sched_htb.get_class_parameters(params))
        return
    ipr.tc(command, "htb", index=index, handle=CLASS_HANDLE, parent=ROOT_HANDLE, **params)


def apply(ipr: IPRoute, host_index: int, nipr: IPRoute, job_index: int, limit: Limit, job: str) -> None:
    """Limit traffic toward the job (host side) and from the job (`nipr`: netlink in the job's netns)."""
    try:
        _htb(ipr, host_index, limit)
        _htb(nipr, job_index, limit)
    except NetlinkError as e:
        raise LarkError(f"cannot install the {limit.mbit:g} Mbit/s limit: {e}", job=job, obj="tc htb",
                        fix="check that the kernel has sch_htb (`lark doctor`)") from None
    log.debug("job %s limited to %g Mbit/s each way (burst %d bytes)", job, limit.mbit, limit.burst)


def change(ipr: IPRoute, host_index: int, nipr: IPRoute, job_index: int, limit: Limit, job: str) -> None:
    """Move a running job's limit (both ends) to a new rate; its queued packets stay."""
    try:
        _htb_class(ipr, host_index, limit, "change-class")
        _htb_class(nipr, job_index, limit, "change-class")
    except NetlinkError as e:
        raise LarkError(f"cannot change the limit to {limit.mbit:g} Mbit/s: {e}", job=job, obj="tc htb class 1:1",
                        fix="the job's devices may be going away; `lark status` shows whether it still runs") \
            from None


def verify(ipr: IPRoute, host_index: int | None, host_if: str, nipr: IPRoute | None, job_index: int | None,
           job_if: str, limit: Limit) -> list[Finding]:
    """The limit `apply` installed (and `change` last set), on each end that still exists: HTB root 1: with class
    1:1 at the job's rate. A missing end is the veth check's finding, not this one's."""
    found = []
    if host_index is not None:
        found.append(_verify_htb(ipr, host_index, f"tc htb on {host_if} (toward the job)", limit))
    if nipr is not None and job_index is not None:
        found.append(_verify_htb(nipr, job_index, f"tc htb on {job_if} in the job's netns (from the job)", limit))
    return found


def _verify_htb(ipr: IPRoute, index: int, obj: str, limit: Limit) -> Finding:
    roots = [q for q in ipr.get_qdiscs(index=index) if q["parent"] == TC_H_ROOT]
    kind = roots[0].get_attr("TCA_KIND") if roots else None
    if kind != "htb" or roots[0]["handle"] != ROOT_HANDLE:
        return drifted(obj, f"no HTB root qdisc 1: (root is {kind or 'the default'}): the job's "
                            f"{limit.mbit:g} Mbit/s limit is off", TC_FIX)
    classes = [c for c in ipr.get_classes(index=index) if c["handle"] == CLASS_HANDLE]
    if not classes:
        return drifted(obj, f"HTB class 1:1 is gone: the job's {limit.mbit:g} Mbit/s limit is off", TC_FIX)
    opts = classes[0].get_attr("TCA_OPTIONS")
    rate_byte = opts.get_attr("TCA_HTB_RATE64") or opts.get_attr("TCA_HTB_PARMS")["rate"]
    if abs(rate_byte * 8 - limit.rate_bit) >= 8:   # the kernel keeps bytes/s
        return drifted(obj, f"HTB class 1:1 limits to {rate_byte * 8 / 1e6:g} Mbit/s, the job's limit is "
                            f"{limit.mbit:g} Mbit/s", TC_FIX)
    return present(obj)
