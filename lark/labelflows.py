"""The label scheme on an EP's switch (issue 26, the pool controller's `[labels] mode = "vlan"`), as `ovs-ofctl`
flow lines (OpenFlow 1.3 actions): the one source of the EP's label flows, for larkd's OVS bridge
(lark.kernel.attach.ovs) and for lark.controller.labels.edge_flows (an EP switch with nothing else on it). Pure and
standard library only, so both sides of the layering (lark/kernel, lark/controller) can import it.

A job's label is an 802.1Q tag its registration answered: the VLAN id is its slice (COMMON_VID without one,
BLOCKED_VID when a drop policy selects it), the PCP its WAN action. The rule on the EP is the core's rule between EPs:
- up: only what the job's port may send (its anti-spoofing, untagged: a frame the job tags itself matches nothing
  and is dropped) is tagged with its label, then LABEL_TABLE decides;
- a job of VLAN V reaches a job of the same EP only if that job is of VLAN V too, or if V is COMMON_VID (the core
  pops COMMON_VID into the untagged domain, which every job but a blocked one receives); nothing reaches a blocked
  job, a blocked job reaches nothing (its frames go up tagged BLOCKED_VID, which the core drops);
- a labelled job reaches the EP host (the bridge's own port) untagged, as the core lets a job reach hosts;
- multicast and broadcast go up tagged and to the EP's jobs the same rule allows (one flow per VLAN in use, which
  lists them, so it is rewritten when a job of that VLAN comes or goes: `member_flows`);
- down, a frame from the uplink tagged V reaches a job of VLAN V untagged; a blocked job gets nothing from it, nor
  NORMAL's flooding of untagged multicast and broadcast (its port is no-flood: port_mods).
"""
from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

VID_PRESENT = 0x1000                  # OFPVID_PRESENT
COMMON_VID = 1                        # a job in no slice: the untagged domain at the core
BLOCKED_VID = 4094                    # a job a drop policy selects: dropped everywhere
LABEL_TABLE = 1
P_UP = 101                            # a standalone switch's twins (larkd's: each allowlist flow's priority + 1)
P_DOWN = 115                          # from the uplink, per job (below larkd's uplink guard, 120)
P_DOWN_MULTICAST = 114
P_PORT_DROP = 90                      # a standalone switch: the rest of a job port's frames
# in LABEL_TABLE
P_BLOCKED = 110
P_DELIVER = 100
P_NOT_LOCAL = 90                      # a frame for a job of this EP its label may not reach
P_MULTICAST = 50
VLAN_PRESENT = "vlan_tci=0x1000/0x1000"
UNTAGGED = "vlan_tci=0x0000/0x1000"
MULTICAST = "dl_dst=01:00:00:00:00:00/01:00:00:00:00:00"


@dataclass(frozen=True)
class EdgeJob:
    """A labelled job on an EP's switch: its MAC, its OpenFlow port (number or name), its label, and `up`: what its
    port may send, as (priority, match without in_port) pairs, each of which gets a twin that tags it."""
    mac: str
    port: int | str
    vid: int
    pcp: int
    up: tuple[tuple[int, str], ...] = ()

    @property
    def blocked(self) -> bool:
        return self.vid == BLOCKED_VID


def own_up(mac: str, ipv4: Iterable[str], ipv6: Iterable[str]) -> tuple[tuple[int, str], ...]:
    """`up` for a switch with no allowlist of its own: the job's MAC, untagged, with its own addresses (ARP: its
    address and MAC)."""
    own = f"dl_src={mac},vlan_tci=0"
    up: list[tuple[int, str]] = []
    for a in ipv4:
        up += [(P_UP, f"{own},ip,nw_src={a}"), (P_UP, f"{own},arp,arp_spa={a},arp_sha={mac}")]
    up += [(P_UP, f"{own},ipv6,ipv6_src={a}") for a in ipv6]
    return tuple(up)


def _outputs(ports: Iterable[int | str]) -> str:
    return ",".join(f"output:{p}" for p in ports)


def job_flows(job: EdgeJob, uplink: int | str, *, normal: bool = True) -> list[str]:
    """The job's own flows (in_port and dl_dst name its port and MAC: they go and come with the job). `normal`: the
    switch's NORMAL flow delivers untagged frames from the uplink (larkd's bridge); without it (a switch running only
    this program) the job's untagged delivery from the uplink and the drop of the rest of its port are here."""
    push = (f"push_vlan:0x8100,set_field:{VID_PRESENT | job.vid}->vlan_vid,set_field:{job.pcp}->vlan_pcp,"
            f"resubmit(,{LABEL_TABLE})")
    out = [f"priority={p},in_port={job.port},{match},actions={push}" for p, match in job.up]
    t = f"table={LABEL_TABLE}"
    if job.blocked:
        out.append(f"priority={P_DOWN},in_port={uplink},dl_dst={job.mac},actions=drop")
    else:
        deliver = f"dl_dst={job.mac},actions=pop_vlan,output:{job.port}"
        out.append(f"priority={P_DOWN},in_port={uplink},dl_vlan={job.vid},{deliver}")
        out += [f"{t},priority={P_DELIVER},dl_vlan={v},{deliver}" for v in sorted({job.vid, COMMON_VID})]
        if not normal:
            out.append(f"priority={P_DOWN},in_port={uplink},{UNTAGGED},dl_dst={job.mac},actions=output:{job.port}")
    out.append(f"{t},priority={P_NOT_LOCAL},dl_dst={job.mac},actions=drop")
    if not normal:
        out.append(f"priority={P_PORT_DROP},in_port={job.port},actions=drop")
    return out


def port_mods(job: EdgeJob, *, normal: bool = True) -> tuple[str, ...]:
    """The `ovs-ofctl mod-port` settings of the job's port. On a switch with NORMAL, a blocked job's port is `no-flood`:
    NORMAL floods untagged multicast and broadcast from the uplink (and from the host) to every port, and no flow can
    take one port out of NORMAL's flooding; without NORMAL the flows above already leave a blocked job out."""
    return ("no-flood",) if normal and job.blocked else ()


def bridge_flows(uplink: int | str, host_mac: str | None, *, normal: bool = True) -> list[str]:
    """The switch's own label flows, the same whatever its jobs: a blocked label goes up only, a labelled frame to
    the host (its MAC, if the switch has a host port) reaches it untagged, anything else goes up tagged."""
    t = f"table={LABEL_TABLE}"
    out = [f"{t},priority={P_BLOCKED},dl_vlan={BLOCKED_VID},actions=output:{uplink}"]
    if host_mac:
        out.append(f"{t},priority={P_DELIVER},{VLAN_PRESENT},dl_dst={host_mac},actions=pop_vlan,LOCAL")
    out.append(f"{t},priority=0,actions=output:{uplink}")
    if not normal:
        out.append("priority=0,actions=drop")
    return out


def local_ports(vid: int, jobs: Iterable[EdgeJob]) -> list[int | str]:
    """The ports of the EP's jobs a frame labelled `vid` may reach (the rule above), in a stable order."""
    return sorted((j.port for j in jobs if not j.blocked and (vid in (j.vid, COMMON_VID))), key=str)


def member_flows(jobs: Iterable[EdgeJob], uplink: int | str, host: bool, *, normal: bool = True) -> list[str]:
    """Multicast and broadcast, per VLAN in use on the switch: up tagged, to the host (`host`) and to the jobs the
    label may reach untagged; from the uplink, tagged, to the jobs of that VLAN. Without NORMAL also the untagged
    multicast from the uplink, to every job but a blocked one. Rewritten whole when a job comes or goes."""
    jobs = list(jobs)
    out = []
    for vid in sorted({j.vid for j in jobs if not j.blocked}):
        ports = local_ports(vid, jobs)
        local = (["LOCAL"] if host else []) + [f"output:{p}" for p in ports]
        out.append(f"table={LABEL_TABLE},priority={P_MULTICAST},dl_vlan={vid},{MULTICAST},"
                   f"actions=output:{uplink},pop_vlan{''.join(',' + a for a in local)}")
        out.append(f"priority={P_DOWN_MULTICAST},in_port={uplink},dl_vlan={vid},{MULTICAST},"
                   f"actions=pop_vlan,{_outputs(ports)}")
    every = local_ports(COMMON_VID, jobs)
    if not normal and every:
        out.append(f"priority={P_DOWN_MULTICAST},in_port={uplink},{UNTAGGED},{MULTICAST},actions={_outputs(every)}")
    return out


def edge_flows(jobs: Iterable[EdgeJob], uplink: int | str, host_mac: str | None = None, *,
               normal: bool = True) -> list[str]:
    """The whole label program of an EP's switch for these jobs."""
    jobs = list(jobs)
    out = bridge_flows(uplink, host_mac, normal=normal)
    for j in jobs:
        out += job_flows(j, uplink, normal=normal)
    return out + member_flows(jobs, uplink, host_mac is not None, normal=normal)


_DELIVERY = re.compile(r"cookie=(0x[0-9a-f]+),.*\btable=1\b.*\bdl_vlan=(\d+),dl_dst=([0-9a-f:]{17})"
                       r" actions=(?:pop|strip)_vlan,output:(\d+)")


def members_from_dump(dump: str) -> dict[int, EdgeJob]:
    """The labelled jobs a switch's table-1 delivery flows show (`ovs-ofctl dump-flows ... table=1`), by cookie:
    how a restarted larkd finds the jobs of the multicast flows again. A job's own VLAN is the one that is not
    COMMON_VID, if it has one; blocked jobs have no delivery flows and are members of nothing."""
    seen: dict[int, EdgeJob] = {}
    for m in _DELIVERY.finditer(dump):
        cookie, vid, mac, port = int(m.group(1), 16), int(m.group(2)), m.group(3), int(m.group(4))
        old = seen.get(cookie)
        if old is None or old.vid == COMMON_VID:
            seen[cookie] = EdgeJob(mac, port, vid, 0)
    return seen
