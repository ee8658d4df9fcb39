"""Policy compilation: a job's registration and the admin's policies into flow specs (plain data), over the
pipeline of lark.controller.pipeline."""
from __future__ import annotations

import hashlib
import ipaddress
import logging
from dataclasses import dataclass

from .config import ControllerConfig
from .model import JobReg
from .pipeline import (
    ETH_IP,
    ETH_IP6,
    SLICE_MASK,
    T_FORWARD,
    T_SLICE,
    T_SOURCE,
    T_WAN,
    WAN_DROP,
    WAN_MASK,
    WAN_SHIFT,
    Flow,
    job_ad,
    selected,
)

log = logging.getLogger(__name__)
P_FOREIGN_PORT = 270   # a confined EP's job's MAC coming in by a port that is not its EP's


@dataclass(frozen=True, slots=True)
class Decision:
    blocked_by: str = ""      # name of the drop policy that selected the job
    slice_name: str = ""      # "" = not sliced
    slice_id: int = 0
    wan_action: int = 0       # 0 none, 1 drop, 2+i steer out wan_ports[i]
    wan_policy: str = ""

    @property
    def metadata(self) -> int:
        return self.slice_id | (self.wan_action << WAN_SHIFT)


def wan_port(d: Decision) -> int | None:
    """Index into wan_ports of the port the job's WAN traffic leaves by: 0 (the normal exit), the one a wan_steer
    policy names, or None when a wan_drop policy keeps it off the WAN."""
    if d.wan_action == WAN_DROP:
        return None
    return d.wan_action - 2 if d.wan_action >= 2 else 0


def slice_id(name: str) -> int:
    """Stable across controller restarts (old flows on the switch keep meaning the same slice); never 0."""
    return int.from_bytes(hashlib.blake2b(name.encode(), digest_size=4).digest(), "big") or 1


def decide(job: JobReg, cfg: ControllerConfig, exprs: dict | None = None) -> Decision:
    """The first matching policy of each kind wins, in file order."""
    exprs = exprs if exprs is not None else {p.name: p.expr() for p in cfg.policies}
    ad = job_ad(job)
    blocked, slice_name, wan, wan_policy = "", "", 0, ""
    for p in cfg.policies:
        if not selected(exprs[p.name], ad):
            continue
        if p.kind == "drop" and not blocked:
            blocked = p.name
        elif p.kind == "slice" and not slice_name:
            value = ad.eval(p.slice_by) if p.slice_by in ad else None
            if isinstance(value, (str, int)) and not isinstance(value, bool):
                slice_name = f"{p.name}:{value}"
        elif p.kind in ("wan_drop", "wan_steer") and not wan_policy:
            wan = WAN_DROP if p.kind == "wan_drop" else 2 + cfg.wan_ports.index(p.port)
            wan_policy = p.name
    if blocked:
        return Decision(blocked_by=blocked)
    return Decision(slice_name=slice_name, slice_id=slice_id(slice_name) if slice_name else 0,
                    wan_action=wan, wan_policy=wan_policy)


def job_flows(job: JobReg, d: Decision, ports: list[str] | tuple[str, ...] = ()) -> list[Flow]:
    """At most 5 flows for a job with one IPv4 address (one more per extra IPv4 address); 2 when blocked.
    `ports`: its EP's switch ports ([ep.NAME] ports). Then the flows that match its source also match the port its
    frames must come in by (one set per port), and one more drops its MAC from any other port: another EP sending
    with this job's MAC or address gets neither its tag nor a place in the switch's MAC table."""
    mac = job.mac
    if d.blocked_by:
        return [Flow(T_SOURCE, 400, (("eth_src", mac),), ("drop",)),
                Flow(T_SOURCE, 400, (("eth_dst", mac),), ("drop",))]
    tag = ("goto", T_SLICE, d.metadata, SLICE_MASK | WAN_MASK)
    flows = []
    entries: list[tuple[tuple[str, str], ...]] = [(("in_port", port),) for port in ports] or [()]
    for at in entries:
        flows += [Flow(T_SOURCE, 300, tuple(sorted((("eth_src", mac), ("eth_type", ETH_IP), ("ipv4_src", a), *at))),
                       tag) for a in job.ipv4]
        if job.ipv4:
            # IPv4 from the job's MAC with any other source address is spoofed: it would escape its slice's tag.
            flows.append(Flow(T_SOURCE, 290, tuple(sorted((("eth_src", mac), ("eth_type", ETH_IP), *at))), ("drop",)))
        flows.append(Flow(T_SOURCE, 280, tuple(sorted((("eth_src", mac), *at))), tag))  # ARP and IPv6: by MAC
    if ports:
        flows.append(Flow(T_SOURCE, P_FOREIGN_PORT, (("eth_src", mac),), ("drop",)))
    if d.slice_id:
        flows += [Flow(T_SLICE, 300, (("eth_dst", mac), ("metadata", (d.slice_id, SLICE_MASK))),
                       ("goto", T_WAN, 0, 0)),
                  Flow(T_SLICE, 290, (("eth_dst", mac),), ("drop",))]
    return flows


def base_flows(cfg: ControllerConfig) -> list[Flow]:
    """The controller's own flows on every switch: table chaining, and the WAN policies aggregated per action
    (their count depends on the policies and site prefixes, never on the number of jobs)."""
    flows = [Flow(T_SOURCE, 0, (), ("goto", T_SLICE, 0, 0)),
             Flow(T_SLICE, 400, (("metadata", (0, SLICE_MASK)),), ("goto", T_WAN, 0, 0)),
             Flow(T_SLICE, 0, (), ("goto", T_WAN, 0, 0)),
             Flow(T_WAN, 0, (), ("goto", T_FORWARD, 0, 0)),
             Flow(T_FORWARD, 0, (), ("normal",))]
    actions = set()
    for p in cfg.policies:
        if p.kind == "wan_drop":
            actions.add(WAN_DROP)
        elif p.kind == "wan_steer":
            actions.add(2 + cfg.wan_ports.index(p.port))
    for action in sorted(actions):
        md = ("metadata", (action << WAN_SHIFT, WAN_MASK))
        verdict = ("drop",) if action == WAN_DROP else ("output", cfg.wan_ports[action - 2])
        for eth_type, fld in ((ETH_IP, "ipv4_dst"), (ETH_IP6, "ipv6_dst")):
            # Link-local and multicast IPv6 (neighbour discovery) never leave the site.
            for prefix in cfg.site_prefixes + (["fe80::/10", "ff00::/8"] if eth_type == ETH_IP6 else []):
                net = ipaddress.ip_network(prefix)
                if (net.version == 4) != (eth_type == ETH_IP):
                    continue
                flows.append(Flow(T_WAN, 300, (("eth_type", eth_type), md,
                                                (fld, (str(net.network_address), str(net.netmask)))),
                                  ("goto", T_FORWARD, 0, 0)))
            flows.append(Flow(T_WAN, 200, (("eth_type", eth_type), md), verdict))
    return flows
