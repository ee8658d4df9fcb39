"""Feasibility: a decided plan and what this execution point offers -> the job can be built here, or a LarkError.

`decide` (policy/engine.py) knows the job and slot ads but not this EP's attach modes, IPv6 sources or firewall
backend; those refusals used to surface mid-build, after the kernel had changed and after PREPARE_JOB had let
the job start. Every refusal that depends only on the plan and this EP's configuration lives here, all of them
collected into one LarkError, so the hold reason names every change the job or the admin has to make at once.
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from ..config import Config
from ..errors import LarkError
from ..plan import NetworkPlan

# What each attach mode is, whatever this EP's configuration: (the job is a station on the site network,
# its port can be put on a VLAN, its frames cross the host's netfilter hooks). OVS switches frames in
# ovs-vswitchd and filters them with OpenFlow; the Linux bridge has no per-job VLAN (attach/bridge.py).
_MODE_KINDS: dict[str, tuple[bool, bool, bool]] = {
    "nat": (False, False, True),
    "bridge": (True, False, True),
    "ovs_bridge": (True, True, False),
}


@dataclass(frozen=True)
class ModeProfile:
    name: str
    bridged: bool
    vlans: bool
    netfilter: bool   # filtered by the firewall backend (else by the mode itself: OpenFlow)
    ipv6: str         # where a job's IPv6 address comes from: "pool", "slaac", "dhcpv6", or "" (no IPv6 here)


@dataclass(frozen=True)
class HostProfile:
    """What this EP offers jobs: the attach modes larkd made, the firewall backend it runs, and tools it uses."""
    modes: tuple[ModeProfile, ...]
    firewall: str
    dhcpv6_client: bool = True    # dhcpcd is installed (bridge_ipv6 = "dhcpv6")

    def mode(self, name: str) -> ModeProfile | None:
        return next((m for m in self.modes if m.name == name), None)


def host_profile(cfg: Config, offered: Iterable[str], firewall: str, dhcpv6_client: bool) -> HostProfile:
    """The profile of an EP whose larkd offers the attach modes `offered` (the names of the modes it made),
    with IPv6 sources read from the configuration exactly as the modes and the setup read them."""
    bridged6 = cfg.bridge_ipv6 if cfg.bridge_ipv6 != "static" else ("pool" if cfg.bridge_range6 else "")
    modes = []
    for name in offered:
        bridged, vlans, netfilter = _MODE_KINDS[name]
        ipv6 = bridged6 if bridged else ("pool" if cfg.subnet6 else "")
        modes.append(ModeProfile(name, bridged, vlans, netfilter, ipv6))
    return HostProfile(tuple(modes), firewall, dhcpv6_client)


@dataclass(frozen=True)
class Refusal:
    obj: str
    what: str
    fix: str


def refusals(plan: NetworkPlan, host: HostProfile) -> list[Refusal]:
    """Every reason this EP cannot build `plan`, in the order setup would meet them; [] when it can."""
    if not plan.has_network:
        return []
    mode = host.mode(plan.network_type)
    if mode is None:
        offered = ", ".join([m.name for m in host.modes] + ["none"])
        return [Refusal("NetworkType", f"network type {plan.network_type!r} is not available on this execution "
                        f"point (it offers {offered})",
                        "make the machine policy choose an offered type; bridge needs LARK_BRIDGE_RANGE, "
                        "ovs_bridge that and Open vSwitch (ovs-vsctl)")]
    out = []
    if plan.vlan is not None and mode.bridged and not mode.vlans:
        out.append(Refusal(f"VLAN {plan.vlan}", f"{mode.name} mode cannot put a job on a VLAN (the Linux bridge "
                           "has no per-job VLAN here)",
                           'use NetworkType = "ovs_bridge" for VLAN jobs, or a machine policy that sets no VLAN '
                           "for bridge jobs"))
    if plan.wants_ipv6 and not mode.ipv6:
        knob = ('LARK_BRIDGE_RANGE6 with LARK_BRIDGE_GATEWAY6, or LARK_BRIDGE_IPV6 = "slaac"' if mode.bridged
                else "LARK_SUBNET6")
        out.append(Refusal("IPProtocol", f"the job wants IPv6 but {mode.name} mode has no IPv6 pool or range on "
                           "this execution point", f'set {knob}, or advertise IPProtocol = "IPv4" on this machine'))
    if plan.wants_ipv6 and mode.ipv6 == "dhcpv6" and not host.dhcpv6_client:
        out.append(Refusal('IPv6 by DHCPv6 (bridge_ipv6 = "dhcpv6")', "dhcpcd is not installed",
                           'install dhcpcd (Debian/Ubuntu: dhcpcd-base; EL: dhcpcd), or use bridge_ipv6 = "slaac"'))
    if host.firewall == "iptables" and mode.netfilter:
        # The iptables backend filters routed IPv4 only: no bridge-family (ebtables-style) tables, no ip6tables.
        if mode.bridged:
            out.append(Refusal("firewall = iptables", f"{mode.name} mode needs the nftables firewall backend",
                               'set LARK_FIREWALL = nftables, or use NetworkType = "nat" or "ovs_bridge"'))
        if plan.wants_ipv6:
            out.append(Refusal("firewall = iptables", f"IPv6 jobs in {mode.name} mode need the nftables firewall "
                               "backend", 'set LARK_FIREWALL = nftables, or advertise IPProtocol = "IPv4"'))
    return out


def check_feasible(plan: NetworkPlan, host: HostProfile) -> None:
    """None when this EP can build `plan`; else one LarkError naming the job and every refusal with its fix."""
    found = refusals(plan, host)
    if len(found) == 1:
        raise LarkError(found[0].what, job=plan.job_id, obj=found[0].obj, fix=found[0].fix)
    if found:
        raise LarkError(f"{len(found)} reasons: " + "; ".join(f"{r.obj}: {r.what} ({r.fix})" for r in found),
                        job=plan.job_id, obj=f"{plan.network_type} network on this execution point")
