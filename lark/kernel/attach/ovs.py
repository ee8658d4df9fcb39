"""Open vSwitch: the job's veth becomes a port (named after the job) of an OVS bridge that holds the uplink.

OVSDB is driven through ovsdbapp (ovsdb.py: one connection per larkd, no process per job) and OpenFlow with
ovs-ofctl as argv lists (one batched call per job setup when its address is known before the port is added, as
static addresses are; two with DHCP). The datapath is the kernel one where the openvswitch module exists and
the userspace (`netdev`) one where it does not (this machine); there TCP needs
`other_config:userspace-tso-enable=true` set before ovs-vswitchd starts (`lark doctor`).

Per job, proactive OpenFlow rules under one cookie (removed by cookie, so teardown needs nothing but the key):
an allowlist (`allowlist_flows`) in front of a drop-all that is in place before the port carries a frame. Every
job port is an access port (untagged, or a RequestedVLAN's tag), never a trunk.
Limits stay tc HTB on the two veth ends (it works on both datapaths, where OVS ingress policing and set_queue
do not on the userspace one), so Lark creates no QoS or Queue rows that could outlive a port. Counters come
from the veth itself: userspace-switched frames never cross the host's netfilter hooks.
"""
from __future__ import annotations

import concurrent.futures
import hashlib
import logging
import os
import re
import threading
import time
from typing import ClassVar

from pyroute2 import IPRoute

from ... import labelflows
from ...errors import LarkError
from ...names import JobNames, key_from_host_if, link_local_of
from ...plan import JobNetwork
from .. import mtu
from ..drift import Finding, drifted, present
from ..firewall.base import SWITCHED, run_tool
from ..links import take_over_uplink
from ..sections import OvsSection, Section
from .base import BridgedMode
from .ovsdb import Ovsdb

log = logging.getLogger(__name__)


def pre_address_flows(mac: str) -> list[str]:
    """A new job port's flows until its address is known: untagged DHCP client messages from its MAC only."""
    return ["priority=90,actions=drop",
            f"priority=95,dl_src={mac},vlan_tci=0,udp,nw_src=0.0.0.0,tp_src=68,tp_dst=67,actions=NORMAL"]


def auto6_pre_address_flows(bridge_ipv6: str, mac: str) -> list[str]:
    """With SLAAC or DHCPv6, until the job's address is known: its router solicitation (so the site's router
    answers) and, with DHCPv6, larkd's dhcpcd's client messages, from its MAC and a link-local address."""
    if bridge_ipv6 not in ("slaac", "dhcpv6"):
        return []
    own = f"priority=95,dl_src={mac},vlan_tci=0"
    flows = [f"{own},icmp6,ipv6_src=fe80::/10,icmp_type=133,actions=NORMAL"]
    if bridge_ipv6 == "dhcpv6":
        flows.append(f"{own},udp6,ipv6_src=fe80::/10,tp_src=546,tp_dst=547,actions=NORMAL")
    return flows


def allowlist_flows(plan: JobNetwork, mac: str) -> list[str]:
    """What may enter the switch from a job's port once its address is known (on top of the pre-address
    flows, whose priority-90 drop ends the list): the job's MAC, untagged, with its own IPv4 address, ARP for
    that address, and with IPv6 its own address and link-local, neighbour advertisements for those only.
    DHCP/DHCPv6 server messages, router advertisements and redirects are dropped whatever their source."""
    own = f"dl_src={mac},vlan_tci=0"
    flows = ["priority=110,udp,tp_src=67,actions=drop"]
    if plan.ipv4:
        flows += [f"priority=100,{own},ip,nw_src={plan.ipv4},actions=NORMAL",
                  f"priority=100,{own},arp,arp_spa={plan.ipv4},arp_sha={mac},actions=NORMAL"]
    if plan.ipv6:
        addrs = [plan.ipv6, link_local_of(mac)]
        flows += ["priority=110,icmp6,icmp_type=134,actions=drop", "priority=110,icmp6,icmp_type=137,actions=drop",
                  "priority=110,udp6,tp_src=547,actions=drop", "priority=104,icmp6,icmp_type=136,actions=drop"]
        flows += [f"priority=105,{own},icmp6,ipv6_src={src},icmp_type=136,nd_target={t},actions=NORMAL"
                  for src in addrs for t in addrs]
        flows += [f"priority=100,{own},ipv6,ipv6_src={a},actions=NORMAL" for a in addrs]
        flows += [f"priority=100,{own},icmp6,ipv6_src=::,icmp_type={t},actions=NORMAL" for t in (135, 143)]
    return flows


# The label scheme (issue 26, the pool controller's `[labels] mode = "vlan"`): the registration answer gives the job a
# label (VLAN id, PCP) that its frames carry toward the uplink. The flows are lark.labelflows' (the one source, shared
# with the controller's edge_flows): twins of the job's allowlist flows, one priority above them, push the label and go
# to LABEL_TABLE, which delivers on this bridge only as the labels allow (the core's rule between EPs) and sends the
# rest up tagged. Per job under its cookie; the bridge's own and the per-VLAN multicast flows under LABEL_BRIDGE_COOKIE,
# rewritten whole (in the same atomic bundle) whenever a labelled job comes or goes.
LABEL_TABLE = labelflows.LABEL_TABLE
LABEL_BLOCKED_VID = labelflows.BLOCKED_VID
LABEL_DOWN_PRIORITY = labelflows.P_DOWN   # below the uplink guard (120)
LABEL_BRIDGE_COOKIE = "0x" + hashlib.sha256(b"ovs-bridge:labels").hexdigest()[:15]


def label_up(plan: JobNetwork, mac: str) -> tuple[tuple[int, str], ...]:
    """What a labelled job's port may send, for its label twins: its allowlist's NORMAL flows, one priority above."""
    up = []
    for f in allowlist_flows(plan, mac):
        if f.endswith(",actions=NORMAL"):
            prio, rest = f.split(",", 1)
            up.append((int(prio.split("=")[1]) + 1, rest[:-len(",actions=NORMAL")]))
    return tuple(up)


def label_flows(plan: JobNetwork, mac: str, port: int, uplink: str, vid: int, pcp: int) -> list[str]:
    """A labelled job's flows (under its cookie, `in_port` or its MAC in each): lark.labelflows.job_flows."""
    return labelflows.job_flows(labelflows.EdgeJob(mac, port, vid, pcp, label_up(plan, mac)), uplink)


def is_label_flow(dump_line: str) -> bool:
    """Whether a dump-flows line under a job's cookie is one of label_flows' (priorities the allowlist never uses)."""
    return f"table={LABEL_TABLE}," in dump_line or any(f"priority={p}," in dump_line
                                                          for p in (101, 106, LABEL_DOWN_PRIORITY))


def cookie_of(key: str) -> str:
    return "0x" + hashlib.sha256(("ovs:" + key).encode()).hexdigest()[:15]


# The bridge's own flows (not a job's): a cookie no job key can produce (job cookies hash "ovs:<key>").
UPLINK_GUARD_COOKIE = "0x" + hashlib.sha256(b"ovs-bridge:uplink-guard").hexdigest()[:15]


def uplink_guard_flows(uplink: str, dns_address: str) -> list[str]:
    """What the site side may not send into the bridge: anything for the host's DNS forwarder (lark/kernel/dns.py).
    OVS jobs reach the forwarder through the bridge's internal port, where the host firewall can tell them only by
    source address (their ports pin it); a site neighbour sending from the uplink with a job's address would pass
    that check. Only jobs, from their own ports, talk to the forwarder."""
    return [f"priority=120,in_port={uplink},ip,nw_dst={dns_address},actions=drop"]


class OvsMode(BridgedMode):
    name = "ovs_bridge"
    counts_by_link = True
    tags_labels = True
    firewall_rules = SWITCHED
    section: ClassVar[type[Section]] = OvsSection
    cfg: OvsSection

    def __init__(self, cfg: OvsSection):
        super().__init__(cfg)
        self.db = Ovsdb(self.cfg.ovs_db)
        self._secured: dict[str, tuple] = {}  # key -> the addresses whose allowlist went in with the port
        # cookie -> a labelled job of this bridge (for the multicast flows); None until read from the bridge
        self._labelled: dict[int, labelflows.EdgeJob] | None = None
        self._host_mac: str | None = None
        self._label_lock = threading.Lock()
        if self.db.reachable():
            # Importing ovsdbapp and reading the tables takes a few hundred ms: not on the first job's setup.
            threading.Thread(target=self._connect_early, name="lark-ovsdb-connect", daemon=True).start()

    def _connect_early(self) -> None:
        try:
            self.db.connect()
        except LarkError as e:
            log.warning("%s (OVS jobs will try again)", e)

    @property
    def br(self) -> str:
        return self.cfg.ovs_bridge_name

    # -- tools ----------------------------------------------------------------------------------------
    def ofctl(self, *args: str, input: str | None = None):
        target = f"unix:{os.path.join(self.cfg.ovs_rundir, self.br + '.mgmt')}"
        return run_tool(["ovs-ofctl", args[0], target, *args[1:]], input=input, what=f"ovs-ofctl {args[0]}")

    @property
    def host_device(self) -> str | None:
        return self.cfg.ovs_bridge_name

    def link_mtu(self, ipr: IPRoute) -> int | None:
        # The OVS internal port does not track its ports' MTU on every datapath: the uplink is the truth.
        return mtu.device_mtu(ipr, self.cfg.ovs_uplink) or mtu.device_mtu(ipr, self.cfg.ovs_bridge_name)

    def datapath(self) -> str:
        if self.cfg.ovs_datapath != "auto":
            return self.cfg.ovs_datapath
        return "system" if os.path.isdir("/sys/module/openvswitch") else "netdev"

    # -- shared bridge ----------------------------------------------------------------------------------
    def prepare(self, ipr: IPRoute) -> None:
        if self._ready:
            return
        api = self.db.api
        if self.db.bridge_ports(self.br) is None:
            dp = self.datapath()
            self.db.run(f"OVS bridge {self.br}", api.add_br(self.br, may_exist=True, datapath_type=dp))
            log.info("created OVS bridge %s (datapath %s)", self.br, dp)
            if self.cfg.ovs_uplink:
                self._add_uplink(ipr)
        self._guard_uplink()
        self._ready = True

    def _guard_uplink(self) -> None:
        """(Re)install the uplink's guard flows; flows do not outlive ovs-vswitchd, so every larkd start does it."""
        if not (self.cfg.ovs_uplink and self.cfg.dns_forward):
            return
        if self.cfg.ovs_uplink not in self.ports_before:
            log.warning("OVS uplink %s is not a port of %s: no guard flows for the DNS forwarder on it",
                        self.cfg.ovs_uplink, self.br)
            return
        flows = uplink_guard_flows(self.cfg.ovs_uplink, self.cfg.dns_address)
        self.ofctl("add-flows", "-", input="".join(f"cookie={UPLINK_GUARD_COOKIE},{f}\n" for f in flows))

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
        self.db.run(f"OVS uplink {self.cfg.ovs_uplink}", self.db.api.add_port(self.br, self.cfg.ovs_uplink,
                                                                              may_exist=True))
        # OVS, not the kernel, is the uplink's master: move the addresses without `master`.
        take_over_uplink(ipr, up[0], br[0], self.br, enslave=False)
        log.info("OVS bridge %s took uplink %s (addresses %s)", self.br, self.cfg.ovs_uplink, addrs_moved)

    # -- per job ----------------------------------------------------------------------------------------
    def attach(self, ipr: IPRoute, host_idx: int, plan: JobNetwork, names: JobNames) -> None:
        """Add the job's port with its drop-all (DHCP client only) flows in place before it carries a frame:
        the host end stays down from add-port until the flows are in. The port is an access port, never a
        trunk: without a RequestedVLAN it is on the untagged network (VLAN 0) and tagged frames are dropped."""
        port = names.host_if
        ipr.link("set", index=host_idx, state="down")
        api = self.db.api
        ofport = self.db.request_ofport(names.key)
        pre = pre_address_flows(names.job_mac)
        if plan.wants_ipv6:
            pre += auto6_pre_address_flows(self.cfg.bridge_ipv6, names.job_mac)
        if plan.ipv4 or plan.ipv6:
            # Static addresses are known already: the allowlist goes in with the drop-all, in one ovs-ofctl call.
            pre += allowlist_flows(plan, names.job_mac)
            self._secured[names.key] = (plan.ipv4, plan.ipv6)
        port_cols = [("vlan_mode", "access")] + ([("tag", int(plan.vlan))] if plan.vlan is not None else [])
        # The flows name the port by the number it asks for, so they go in (ovs-ofctl, ~10 ms) while OVSDB takes
        # the port, both at once; ovs-vswitchd then adds a port whose flows are already there.
        with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="lark-ofctl") as ex:
            flows = ex.submit(self.ofctl, "add-flows", "-", input="".join(
                f"cookie={cookie_of(names.key)},in_port={ofport},{f}\n" for f in pre))
            self.db.run(f"OVS port {port} of job {plan.job_id}",
                        api.add_port(self.br, port, may_exist=True),
                        api.db_set("Interface", port, ("ofport_request", ofport),
                                   ("external_ids", {"lark-key": names.key, "lark-job": plan.job_id})),
                        api.db_set("Port", port, *port_cols), wait=False)
            flows.result()
        got = self.db.wait_ofport(port, plan.job_id)
        if got != ofport:
            raise LarkError(f"Open vSwitch gave the port number {got}, not the {ofport} its flows name",
                            job=plan.job_id, obj=f"OVS port {port}",
                            fix="another OVS client took the number; `lark gc` and start the job again")
        # The host end is still a plain netdev for the kernel: with the default arp_ignore=0 it answers the
        # job's ARP for any host address with its own MAC, and what the job then sends to the host (DNS to
        # the forwarder) lands on this device instead of the bridge's internal port. It has no address: never
        # answer.
        with open(f"/proc/sys/net/ipv4/conf/{port}/arp_ignore", "w") as f:
            f.write("1")
        ipr.link("set", index=host_idx, state="up")

    def secure(self, plan: JobNetwork, names: JobNames) -> None:
        if self._secured.pop(names.key, None) == (plan.ipv4, plan.ipv6):
            return  # its allowlist went in with the port (attach)
        c, port = cookie_of(names.key), self.db.wait_ofport(names.host_if, plan.job_id)
        flows = "".join(f"cookie={c},in_port={port},{f}\n" for f in allowlist_flows(plan, names.job_mac))
        self.ofctl("add-flows", "-", input=flows)

    def ofctl_bundle(self, lines: list[str], what: str):
        """One `ovs-ofctl --bundle add-flows` (OpenFlow 1.4: one atomic transaction; each line may start with `add`
        or `delete`, and they run in order)."""
        target = f"unix:{os.path.join(self.cfg.ovs_rundir, self.br + '.mgmt')}"
        return run_tool(["ovs-ofctl", "-O", "OpenFlow14", "--bundle", "add-flows", target, "-"],
                        input="".join(line + "\n" for line in lines), what=what)

    def _label_members(self) -> dict[int, labelflows.EdgeJob]:
        """This bridge's labelled jobs by cookie: kept in memory, read from the bridge's table 1 once per larkd (the
        jobs that ran across a larkd restart keep their multicast)."""
        if self._labelled is None:
            target = f"unix:{os.path.join(self.cfg.ovs_rundir, self.br + '.mgmt')}"
            dump = run_tool(["ovs-ofctl", "-O", "OpenFlow13", "dump-flows", target, f"table={LABEL_TABLE}"],
                            what=f"the label flows of OVS bridge {self.br}").stdout
            self._labelled = labelflows.members_from_dump(dump)
        return self._labelled

    def _bridge_label_lines(self, uplink: str) -> list[str]:
        """The bridge's label flows, rewritten whole: delete LABEL_BRIDGE_COOKIE's, then the bridge flows and the
        multicast flows of the labelled jobs now on it (a bundle's lines run in order, atomically)."""
        if self._host_mac is None:
            with IPRoute() as ipr:   # the bridge's own port (the host), in larkd's netns
                self._host_mac = ipr.get_links(ipr.link_lookup(ifname=self.br)[0])[0].get_attr("IFLA_ADDRESS")
        jobs = self._label_members().values()
        c = LABEL_BRIDGE_COOKIE
        return [f"delete cookie={c}/-1",
                *(f"cookie={c},{f}" for f in labelflows.bridge_flows(uplink, self._host_mac)),
                *(f"cookie={c},{f}" for f in labelflows.member_flows(jobs, uplink, host=True))]

    def apply_label(self, plan: JobNetwork, names: JobNames, vid: int, pcp: int) -> bool:
        """Tag the job's frames toward the uplink with its label (after secure: its allowlist is in), in one
        ovs-ofctl call: the job's label flows under its cookie and the bridge's rewritten multicast flows, one
        bundle. False, logged, when this bridge cannot: no uplink, or the job's port is already a RequestedVLAN's
        access port."""
        uplink = self.cfg.ovs_uplink
        if not uplink or plan.vlan is not None:
            log.warning("job %s: the controller's label (VLAN %s, PCP %s) is not applied: %s", plan.job_id, vid, pcp,
                        "the OVS bridge has no uplink (LARK_OVS_UPLINK)" if not uplink else
                        f"its port is on RequestedVLAN {plan.vlan}; labels and per-job VLANs do not mix")
            return False
        port = self.db.wait_ofport(names.host_if, plan.job_id)
        c = cookie_of(names.key)
        job = labelflows.EdgeJob(names.job_mac, port, vid, pcp, label_up(plan, names.job_mac))
        with self._label_lock:
            members = self._label_members()
            before = dict(members)
            for k in [k for k, m in members.items() if m.port == port]:
                del members[k]   # a job whose port number this one reuses has gone (ended while larkd was down)
            members[int(c, 16)] = job
            try:
                self.ofctl_bundle([*self._bridge_label_lines(uplink),
                                   *(f"cookie={c},{f}" for f in labelflows.job_flows(job, uplink))],
                                  what=f"the label flows of job {plan.job_id} on OVS bridge {self.br}")
                for setting in labelflows.port_mods(job):   # a blocked job: out of NORMAL's flooding
                    self.ofctl("mod-port", str(port), setting)
            except LarkError:
                members.clear()
                members.update(before)
                raise
        log.info("job %s: its frames leave OVS bridge %s on %s with VLAN %s, PCP %s", plan.job_id, self.br, uplink,
                 vid, pcp)
        return True

    def verify(self, ipr: IPRoute, host_idx: int, plan: JobNetwork, names: JobNames) -> list[Finding]:
        """The job's port on the bridge, and as many flows under its cookie as attach and secure put there."""
        fix = ("something other than larkd changed the OVS bridge (`ovs-vsctl del-port`, `ovs-ofctl del-flows`, or "
               "ovs-vswitchd restarted and lost the flows)")
        what = f"OVS port {names.host_if} on {self.br}"
        if names.host_if not in (self.db.bridge_ports(self.br) or set()):
            return [drifted(what, "the job's port is gone from the bridge: the job is cut off", fix)]
        flows = [*pre_address_flows(names.job_mac), *allowlist_flows(plan, names.job_mac)]
        if plan.wants_ipv6:
            flows += auto6_pre_address_flows(self.cfg.bridge_ipv6, names.job_mac)
        dump = self.ofctl("dump-flows", f"cookie={cookie_of(names.key)}/-1").stdout
        have = sum(1 for line in dump.splitlines() if "cookie=" in line and not is_label_flow(line))
        what_flows = f"OpenFlow rules of {names.host_if} (cookie {cookie_of(names.key)})"
        return [present(what), present(what_flows) if have == len(set(flows)) else
                drifted(what_flows, f"{have} flow(s) where setup put {len(set(flows))}", fix),
                *self._verify_label(plan, names, dump, fix)]

    def _verify_label(self, plan: JobNetwork, names: JobNames, dump: str, fix: str) -> list[Finding]:
        """A labelled job's label flows (its own, under its cookie), the bridge's label flows (LABEL_BRIDGE_COOKIE:
        the bridge flows and the multicast flows of the labelled jobs larkd knows), and a blocked job's no-flood port,
        against lark.labelflows. Which label: the one larkd applied (kept in memory), else the one its tagging flows
        push (after a larkd restart; a job whose label flows are all gone then is not known to be labelled)."""
        uplink = self.cfg.ovs_uplink
        c = cookie_of(names.key)
        mine = [line for line in dump.splitlines() if "cookie=" in line and is_label_flow(line)]
        if not uplink:
            return []
        with self._label_lock:
            known = self._label_members().get(int(c, 16))
            bridge = self._bridge_label_lines(uplink)[1:]   # without its leading delete
        if known is not None:
            vid, pcp = known.vid, known.pcp
        else:
            pushed = re.search(r"(?:set_field:|mod_vlan_vid:)(\d+)(?:->vlan_vid)?,(?:set_field:|mod_vlan_pcp:)(\d)",
                               dump)
            if pushed is None:
                return []   # not labelled (or its label flows are gone and larkd restarted since: not known)
            vid, pcp = int(pushed.group(1)) & 0xFFF, int(pushed.group(2))
        port = self.db.wait_ofport(names.host_if, plan.job_id)
        job = labelflows.EdgeJob(names.job_mac, port, vid, pcp, label_up(plan, names.job_mac))
        want = len(set(labelflows.job_flows(job, uplink)))
        what = f"label flows of {names.host_if} (VLAN {vid}, PCP {pcp})"
        out = [present(what) if len(mine) == want else
               drifted(what, f"{len(mine)} flow(s) where the label put {want}: its frames may leave untagged or not at "
                             "all", fix)]
        have_bridge = sum(1 for line in self.ofctl("dump-flows", f"cookie={LABEL_BRIDGE_COOKIE}/-1").stdout.splitlines()
                          if "cookie=" in line)
        what = f"label flows of OVS bridge {self.br} (cookie {LABEL_BRIDGE_COOKIE})"
        out.append(present(what) if have_bridge == len(set(bridge)) else
                   drifted(what, f"{have_bridge} flow(s) where the labelled jobs need {len(set(bridge))}", fix))
        for setting in labelflows.port_mods(job):
            desc = self.ofctl("dump-ports-desc", str(port)).stdout
            what = f"OVS port {names.host_if} {setting}"
            out.append(present(what) if setting.replace("-", "_").upper() in desc else
                       drifted(what, "a blocked job's port floods: the site's broadcasts reach the job", fix))
        return out

    def detach(self, names: JobNames) -> bool:
        """Remove the job's port and flows; safe to repeat. True when OVSDB took the port's removal."""
        self._secured.pop(names.key, None)
        ok = True
        if self.db.reachable():
            try:
                self.db.run(f"OVS port {names.host_if}", self.db.api.del_port(names.host_if, self.br, if_exists=True),
                            wait=False)
            except LarkError as e:
                log.warning("could not remove OVS port %s: %s", names.host_if, e)
                ok = False
        c = cookie_of(names.key)
        with self._label_lock:
            try:
                members = self._label_members() if self.cfg.ovs_uplink else {}
            except LarkError as e:
                log.debug("could not read the label flows of OVS bridge %s: %s", self.br, e)
                members = {}
            labelled = members.pop(int(c, 16), None)
            try:
                if labelled is not None:
                    # one bundle: the job's flows and its place in the bridge's multicast flows
                    self.ofctl_bundle([f"delete cookie={c}/-1", *self._bridge_label_lines(self.cfg.ovs_uplink)],
                                      what=f"the flows of OVS port {names.host_if}")
                else:
                    self.ofctl("del-flows", f"cookie={c}/-1")
            except LarkError as e:
                if labelled is not None:
                    members[int(c, 16)] = labelled   # the next teardown (lark gc) tries again
                log.debug("no flows removed for %s: %s", names.key, e)
        self.db.forget_ofport(names.key)
        return ok

    @property
    def ports_before(self) -> set[str]:
        if not self.db.reachable():
            return set()
        try:
            return self.db.bridge_ports(self.br) or set()
        except LarkError as e:
            log.warning("could not list the ports of OVS bridge %s: %s", self.br, e)
            return set()

    def job_keys(self) -> set[str]:
        """Keys of job ports on the bridge (for gc)."""
        return {key for key in map(key_from_host_if, self.ports_before) if key}
