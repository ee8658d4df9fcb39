"""Modes as profiles: what each network type builds for a job, and the properties the rest of larkd asks about.

The attach module (lark/kernel/attach/) says how a veth meets the world; the profile says which resources a job of
that type gets (names of lark/daemon/resources.py's list, built in that list's order) and answers the questions
that used to be `if mode.name == ...` in the orchestrator. A new mode is one attach module plus one line here.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..config import Config
from ..kernel.attach.base import AttachMode
from ..plan import NetworkPlan

# Every networked job: in the job's netns, on a veth, attached, addressed, steered, shaped, filtered, registered.
NETWORKED = ("netns", "host-prepare", "reservations", "veth", "attach", "job-side", "address", "dns", "shaping",
             "mode-filter", "job-netns-filter", "scitags", "controller", "firewall")
# A station on the site's network may take its IPv4 address from the site's DHCP server.
BRIDGED = (*NETWORKED, "dhcp-lease")
# NetworkType none: its own netns with only lo up.
NONE = ("netns", "job-side")


@dataclass(frozen=True)
class Profile:
    network_type: str
    mode: AttachMode | None
    resources: tuple[str, ...]
    # The Linux bridge's ports are filtered by the firewall's bridge table, which must exist before the port joins
    # (OVS filters with its own flows, NAT in the inet table).
    bridge_table: bool = False

    @property
    def bridged(self) -> bool:
        """The job is a station on a shared L2 network (its own MAC, the site's addresses)."""
        return self.mode is not None and self.mode.bridged

    @property
    def tags_labels(self) -> bool:
        """Its mode tags the job's frames with a label-scheme controller's label (issue 26)."""
        return self.mode is not None and self.mode.tags_labels

    @property
    def firewall_rules(self) -> str:
        """The host firewall's rule set for its jobs (its attach mode's)."""
        assert self.mode is not None, "a job without a network has no host firewall rules"
        return self.mode.firewall_rules

    @property
    def counts_by_link(self) -> bool:
        """Its traffic bypasses netfilter: the accountant reads the veth's counters."""
        return self.mode is not None and self.mode.counts_by_link

    def dhcp4(self, plan: NetworkPlan) -> bool:
        return self.bridged and plan.address_type == "dhcp" and plan.wants_ipv4

    def slaac(self, plan: NetworkPlan, cfg: Config) -> bool:
        return self.bridged and plan.wants_ipv6 and cfg.bridge_ipv6 == "slaac"

    def dhcpv6(self, plan: NetworkPlan, cfg: Config) -> bool:
        return self.bridged and plan.wants_ipv6 and cfg.bridge_ipv6 == "dhcpv6"


# Per network type: the resources and the traits beyond the attach mode's own (bridged, counts_by_link).
_TRAITS: dict[str, dict] = {
    "nat": {"resources": NETWORKED},
    "bridge": {"resources": BRIDGED, "bridge_table": True},
    "ovs_bridge": {"resources": BRIDGED},
}
NO_NETWORK = Profile("none", None, NONE)


def make_profiles(modes: dict[str, AttachMode]) -> dict[str, Profile]:
    """One profile per mode this EP made (make_modes), plus `none`."""
    out = {"none": NO_NETWORK}
    for network_type, mode in modes.items():
        traits = _TRAITS.get(network_type, {"resources": BRIDGED if mode.bridged else NETWORKED})
        out[network_type] = Profile(network_type, mode, **traits)
    return out
