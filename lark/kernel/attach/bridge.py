"""Linux bridge: the job's veth becomes a port of a bridge that also holds the uplink, so the job is a
station on the site network with an address of its own (static range here; DHCP is the next step).

The bridge is adopted when it exists (the admin made it, with the uplink and the host's address on it);
otherwise Lark creates it with STP off and forward delay 0 (a new port forwards at once), and, when
`bridge_uplink` is set, moves the uplink's IPv4 addresses and default route to the bridge before enslaving
it, so the host keeps its connectivity. Anti-spoofing lives in the firewall's bridge-family table.
"""
from __future__ import annotations

import logging
import os
from typing import ClassVar

from pyroute2 import IPRoute

from ...errors import LarkError
from ...names import JobNames
from ...plan import JobNetwork
from .. import mtu
from ..drift import Finding, drifted, present
from ..firewall import same_ep
from ..firewall.base import BRIDGED
from ..links import take_over_uplink, wait_bridge_port_forwarding
from ..sections import BridgeSection, Section
from .base import BridgedMode
from .isolation import is_isolated, isolate_port, pinned_macs

log = logging.getLogger(__name__)


class BridgeMode(BridgedMode):
    name = "bridge"
    firewall_rules = BRIDGED
    section: ClassVar[type[Section]] = BridgeSection
    cfg: BridgeSection

    def __init__(self, cfg: BridgeSection):
        super().__init__(cfg)

    @property
    def created_marker(self) -> str:
        return os.path.join(self.cfg.run_dir, f"bridge-{self.cfg.bridge_name}.created")

    @property
    def host_device(self) -> str | None:
        return self.cfg.bridge_name

    def link_mtu(self, ipr: IPRoute) -> int | None:
        # The bridge's MTU is its smallest port's (the uplink's, once enslaved).
        return mtu.device_mtu(ipr, self.cfg.bridge_name)

    def prepare(self, ipr: IPRoute) -> None:
        if self._ready and ipr.link_lookup(ifname=self.cfg.bridge_name):
            return
        name = self.cfg.bridge_name
        found = ipr.link_lookup(ifname=name)
        if found:
            kind = ipr.get_links(found[0])[0].get_nested("IFLA_LINKINFO", "IFLA_INFO_KIND")
            if kind != "bridge":
                raise LarkError(f"{name} exists but is a {kind or 'plain'} device, not a bridge", obj="bridge_name",
                                fix="name a Linux bridge, or a name that is free")
        else:
            self._create(ipr, name)
        self._ready = True

    def _create(self, ipr: IPRoute, name: str) -> None:
        ipr.link("add", ifname=name, kind="bridge", br_stp_state=0, br_forward_delay=0)
        os.makedirs(self.cfg.run_dir, exist_ok=True)
        with open(self.created_marker, "w") as f:
            f.write(self.cfg.bridge_uplink + "\n")
        br = ipr.link_lookup(ifname=name)[0]
        uplink = self.cfg.bridge_uplink
        if uplink:
            found = ipr.link_lookup(ifname=uplink)
            if not found:
                raise LarkError(f"bridge uplink {uplink} does not exist", obj="bridge_uplink",
                                fix="name the interface toward the site network, or leave it empty")
            take_over_uplink(ipr, found[0], br, name)
        ipr.link("set", index=br, state="up")
        log.info("created bridge %s%s", name, f" with uplink {uplink}" if uplink else "")

    def attach(self, ipr: IPRoute, host_idx: int, plan: JobNetwork, names: JobNames) -> None:
        br = ipr.link_lookup(ifname=self.cfg.bridge_name)
        if not br:
            raise LarkError("the bridge disappeared", job=plan.job_id, obj=self.cfg.bridge_name,
                            fix="restart larkd to recreate it")
        if plan.vlan is not None:
            raise LarkError("this kernel's bridge has no VLAN filtering (CONFIG_BRIDGE_VLAN_FILTERING)",
                            job=plan.job_id, obj=f"VLAN {plan.vlan}",
                            fix="use NetworkType = \"ovs_bridge\" for VLANs, see `lark doctor`")
        ipr.link("set", index=host_idx, master=br[0])
        if self.cfg.bridge_isolate_jobs:
            isolate_port(ipr, host_idx, names.job_mac, plan.job_id, self.cfg.bridge_name)

    def secure(self, plan: JobNetwork, names: JobNames) -> None:
        if self.cfg.bridge_isolate_jobs:
            # Frames for another job of this EP go out of the uplink (the isolated port would drop them).
            same_ep.apply(same_ep.job_cmds(self.cfg.nft_table, self.cfg.bridge_uplink, names.host_if, names.nft_id,
                                           names.job_mac, plan), f"nft netdev chains of {names.host_if}", plan.job_id)

    def verify(self, ipr: IPRoute, host_idx: int, plan: JobNetwork, names: JobNames) -> list[Finding]:
        """The port's bridge membership, and with bridge_isolate_jobs its isolation, pinned MAC and same-EP chains."""
        fix = f"something other than larkd changed {names.host_if} (`ip link set ... nomaster`, `bridge link set`)"
        what = f"port {names.host_if} of bridge {self.cfg.bridge_name}"
        br = ipr.link_lookup(ifname=self.cfg.bridge_name)
        if not br:
            return [drifted(f"bridge {self.cfg.bridge_name}", "the bridge is gone", "something other than larkd "
                            "deleted it; restart larkd to recreate it (every bridged job needs a new network)")]
        if ipr.get_links(host_idx)[0].get_attr("IFLA_MASTER") != br[0]:
            return [drifted(what, f"{names.host_if} left the bridge: the job is cut off", fix)]
        found = [present(what)]
        if self.cfg.bridge_isolate_jobs:
            what = f"isolation of {what}"
            found.append(present(what) if is_isolated(ipr, host_idx) else
                         drifted(what, "the port is no longer isolated: the job reaches other jobs without the "
                                       "pool's switch", fix))
            what = f"sticky FDB entry {names.job_mac} on {names.host_if}"
            found.append(present(what) if names.job_mac.lower() in pinned_macs(ipr, host_idx) else
                         drifted(what, "the job's MAC is no longer pinned to its port", fix))
            found += same_ep.verify_job(self.cfg.nft_table, self.cfg.bridge_uplink, names.host_if, names.nft_id,
                                        names.job_mac, plan)
        return found

    def detach(self, names: JobNames) -> bool:
        if self.cfg.bridge_isolate_jobs:
            same_ep.forget_mac(self.cfg.nft_table, names.job_mac)
        return False

    def wait_forwarding(self, ipr: IPRoute, host_idx: int, job: str) -> None:
        wait_bridge_port_forwarding(ipr, host_idx, job)
