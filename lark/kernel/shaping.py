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
from pyroute2.netlink.exceptions import NetlinkError

from ..errors import LarkError

log = logging.getLogger(__name__)

ROOT_HANDLE = 0x10000      # 1:
CLASS_HANDLE = 0x10001     # 1:1, also the default class: every packet is the job's
GSO_MAX = 65536            # veth hands TSO/GSO packets of up to 64 KiB to the qdisc
BURST_TIME = 0.005         # seconds of traffic a bucket may hold
MAX_RATE_MBIT = 10_000_000  # 10 Tbit/s: anything above is a typo, not a NIC


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


def _htb(ipr: IPRoute, index: int, limit: Limit) -> None:
    ipr.tc("add", "htb", index=index, handle=ROOT_HANDLE, default=CLASS_HANDLE & 0xFFFF)
    _htb_class(ipr, index, limit, "add-class")


def _htb_class(ipr: IPRoute, index: int, limit: Limit, command: str) -> None:
    # pyroute2 sends TCA_HTB_RATE64/CEIL64 itself for rates of 2^32 bytes/s (34 Gbit/s) and more.
    ipr.tc(command, "htb", index=index, handle=CLASS_HANDLE, parent=ROOT_HANDLE,
           rate=f"{limit.rate_bit}bit", ceil=f"{limit.rate_bit}bit", burst=limit.burst, cburst=limit.burst,
           quantum=min(max(limit.rate_bit // 8 // 10, 1514), 200_000))


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
