"""Jobs on the same EP: the EP isolates its job ports (larkd's `bridge_isolate_jobs`), so a frame from one of its
jobs to another leaves by the EP's uplink, goes through the core's tables like any other, and is sent back out the
port it came in on. NORMAL never does that (it never outputs to the in_port), so these flows do (docs/design.md).

  per job of an EP in `ep_ports`:  table 3, in_port=EP, eth_dst=MAC         -> output:IN_PORT
  per EP port (base):              table 3, in_port=EP, eth_dst=multicast   -> output:IN_PORT, NORMAL
Both sit in table 3 (FORWARD), so the drop, slice and WAN tables have decided before; at priority 200, above the
WAN-meter flows (same-EP traffic never leaves the site). Port names are resolved per switch (ofapp), like wan_ports.
"""
from __future__ import annotations

from .config import ControllerConfig
from .model import JobReg
from .pipeline import T_FORWARD, Flow

P_HAIRPIN = 200
MULTICAST = ("01:00:00:00:00:00", "01:00:00:00:00:00")   # the group bit: broadcast and every multicast


def job_flows(job: JobReg, cfg: ControllerConfig) -> list[Flow]:
    """One flow for a job whose EP's switch port is known; none otherwise (or when the job is blocked: the
    caller leaves it out then, as table 0 drops everything to and from its MAC)."""
    port = cfg.ep_ports.get(job.ep)
    if not port:
        return []
    return [Flow(T_FORWARD, P_HAIRPIN, (("eth_dst", job.mac), ("in_port", port)), ("in_port",))]


def base_flows(cfg: ControllerConfig) -> list[Flow]:
    """One flow per EP port: broadcasts and multicasts from an EP also go back to it (ARP, neighbour discovery)."""
    return [Flow(T_FORWARD, P_HAIRPIN, (("eth_dst", MULTICAST), ("in_port", port)), ("in_port_normal",))
            for port in sorted(set(cfg.ep_ports.values()))]
