"""Open vSwitch: the job's veth becomes a port (named after the job) of an OVS bridge that holds the uplink.

OVSDB is driven with ovs-vsctl and OpenFlow with ovs-ofctl, always as argv lists. The datapath is the kernel
one where the openvswitch module exists and the userspace (`netdev`) one where it does not (this machine);
there TCP needs `other_config:userspace-tso-enable=true` set before ovs-vswitchd starts (`lark doctor`).

Per job, proactive OpenFlow rules under one cookie (removed by cookie, so teardown needs nothing but the key):
frames from the job's port pass to NORMAL only with the job's MAC and, for IPv4 and ARP, the job's address;
everything else from that port is dropped. A RequestedVLAN makes the port an access port with that tag.
Limits stay tc HTB on the two veth ends (it works on both datapaths, where OVS ingress policing and set_queue
do not on the userspace one), so Lark creates no QoS or Queue rows that could outlive a port. Counters come
from the veth itself: userspace-switched frames never cross the host's netfilter hooks.
"""
from __future__ import annotations

import hashlib
import logging
import os
import time

from pyroute2 import IPRoute

from ...errors import LarkError
from ..firewall.base import run_tool
from ..links import take_over_uplink
from ...names import JobNames, key_from_host_if
from ...plan import JobNetwork
from .base import BridgedMode

log = logging.getLogger(__name__)


def cookie_of(key: str) -> str:
    return "0x" + hashlib.sha256(("ovs:" + key).encode()).hexdigest()[:15]


def ra_guard_flows(cookie: str, port: str) -> str:
    """No job port may act as a router (RAs, redirects) or DHCPv6 server: only the uplink side hands out IPv6
    configuration (lark/kernel/ipv6auto.py). Above the job's allow rules, which pass its link-local source."""
    return "".join(f"cookie={cookie},priority=110,in_port={port},{m},actions=drop\n"
                   for m in ("icmp6,icmp_type=134", "icmp6,icmp_type=137", "udp6,tp_src=547"))


class OvsMode(BridgedMode):
    name = "ovs_bridge"
    counts_by_link = True

    @property
    def br(self) -> str:
        return self.cfg.ovs_bridge_name

    # -- tools ----------------------------------------------------------------------------------------
    def vsctl(self, *args: str, check: bool = True):
        return run_tool(["ovs-vsctl", f"--db={self.cfg.ovs_db}", "--timeout=10", *args], what="ovs-vsctl",
                        check=check)

    def ofctl(self, *args: str, input: str | None = None):
        target = f"unix:{os.path.join(self.cfg.ovs_rundir, self.br + '.mgmt')}"
        return run_tool(["ovs-ofctl", args[0], target, *args[1:]], input=input, what=f"ovs-ofctl {args[0]}")

    def datapath(self) -> str:
        if self.cfg.ovs_datapath != "auto":
            return self.cfg.ovs_datapath
        return "system" if os.path.isdir("/sys/module/openvswitch") else "netdev"

    # -- shared bridge ----------------------------------------------------------------------------------
    def prepare(self, ipr: IPRoute) -> None:
        if self._ready:
            return
        if self.vsctl("br-exists", self.br, check=False).returncode != 0:
            dp = self.datapath()
            self.vsctl("--may-exist", "add-br", self.br, "--", "set", "bridge", self.br, f"datapath_type={dp}")
            log.info("created OVS bridge %s (datapath %s)", self.br, dp)
            if self.cfg.ovs_uplink:
                self._add_uplink(ipr)
        self._ready = True

    def _add_uplink(self, ipr: IPRoute) -> None:
        up = ipr.link_lookup(ifname=self.cfg.ovs_uplink)
        if not up:
            raise LarkError(f"OVS uplink {self.cfg.ovs_uplink} does not exist", obj="ovs_uplink",
                            fix="name the interface toward the site network, or leave it empty")
        deadline = time.time() + 5
        while not ipr.link_lookup(ifname=self.br) and time.time() < deadline:
            time.sleep(0.05)  # the bridge's internal port appears once ovs-vswitchd has seen the new row
        br = ipr.link_lookup(ifname=self.br)
        if not br:
            raise LarkError("the OVS bridge's internal port never appeared", obj=self.br,
                            fix="check that ovs-vswitchd runs (ovs-vsctl show)")
        addrs_moved = [a.get_attr("IFA_ADDRESS") for a in ipr.get_addr(index=up[0], family=2)]
        self.vsctl("--may-exist", "add-port", self.br, self.cfg.ovs_uplink)
        # OVS, not the kernel, is the uplink's master: move the addresses without `master`.
        take_over_uplink(ipr, up[0], br[0], self.br, enslave=False)
        log.info("OVS bridge %s took uplink %s (addresses %s)", self.br, self.cfg.ovs_uplink, addrs_moved)

    # -- per job ----------------------------------------------------------------------------------------
    def attach(self, ipr: IPRoute, host_idx: int, plan: JobNetwork, names: JobNames) -> None:
        port = names.host_if
        args = ["--may-exist", "add-port", self.br, port, "--", "set", "interface", port,
                f"external_ids:lark-key={names.key}", f"external_ids:lark-job={plan.job_id}"]
        if plan.vlan is not None:
            args += ["--", "set", "port", port, f"tag={int(plan.vlan)}"]
        self.vsctl(*args)
        # The host end is still a plain netdev for the kernel: with the default arp_ignore=0 it answers the
        # job's ARP for any host address with its own MAC, and what the job then sends to the host (DNS to
        # the forwarder) lands on this device instead of the bridge's internal port. It has no address: never
        # answer.
        with open(f"/proc/sys/net/ipv4/conf/{port}/arp_ignore", "w") as f:
            f.write("1")

    def secure(self, plan: JobNetwork, names: JobNames) -> None:
        port = names.host_if
        c = cookie_of(names.key)
        mac, ip = names.job_mac, plan.ipv4
        allow = []
        if ip:
            allow += [f"ip,nw_src={ip}", f"arp,arp_spa={ip},arp_sha={mac}"]
        if plan.ipv6:
            # Its address, and link-local / unspecified sources for neighbour discovery.
            allow += [f"ipv6,ipv6_src={plan.ipv6}", "ipv6,ipv6_src=fe80::/10", "ipv6,ipv6_src=::"]
        flows = "".join(f"cookie={c},priority=100,in_port={port},dl_src={mac},{m},actions=NORMAL\n" for m in allow)
        flows += f"cookie={c},priority=90,in_port={port},actions=drop\n"
        if plan.ipv6:  # without IPv6 the priority-90 drop already takes all of it
            flows += ra_guard_flows(c, port)
        self.ofctl("add-flows", "-", input=flows)

    def detach(self, names: JobNames) -> bool:
        """Remove the job's port and flows; safe to repeat. True when ovs-vsctl ran cleanly."""
        ok = self.vsctl("--if-exists", "del-port", self.br, names.host_if, check=False).returncode == 0
        try:
            self.ofctl("del-flows", f"cookie={cookie_of(names.key)}/-1")
        except LarkError as e:
            log.debug("no flows removed for %s: %s", names.key, e)
        return ok

    @property
    def ports_before(self) -> set[str]:
        cp = self.vsctl("list-ports", self.br, check=False)
        return set(cp.stdout.split()) if cp.returncode == 0 else set()

    def job_keys(self) -> set[str]:
        """Keys of job ports on the bridge (for gc)."""
        return {key for key in map(key_from_host_if, self.ports_before) if key}
