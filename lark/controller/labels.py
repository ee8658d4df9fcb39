"""The label scheme (issue 26, `[labels] mode = "vlan"`): core flows that grow with EPs and policies, not with jobs.

The EP marks each job's frames on its uplink with the job's *label*, an 802.1Q tag the controller chose and returned
in the registration answer: the VLAN id names the job's isolation domain (its slice; COMMON_VID when it has none;
BLOCKED_VID when a drop policy selects it) and the priority bits (PCP) carry its WAN action (0 none, 1 drop, 2+i
steer out wan_ports[i]). The EP does the per-job part locally (the job's port, MAC and address, anti-spoofing),
delivers between its own jobs as the labels allow and a tagged frame from its uplink only to its jobs of that VLAN
(lark.labelflows, which edge_flows runs on a bare EP switch and larkd's OVS bridge runs too). The core
(core_flows) checks, per EP, that tagged frames come in by that EP's port with a source address in its range, drops
the blocked VLAN, turns the PCP into the WAN metadata of the usual pipeline, and keeps the tag on frames to another
job (NORMAL switches them within their VLAN, so they reach only jobs of the same slice) while it pops the tag on
frames to anything else (hosts, the WAN: the untagged domain, which every job's port also receives).

Flows on the core: per EP port, one per IPv4 network of its [ep.NAME] addresses (IP) and one more (ARP), one per
IPv6 network; a constant number per WAN action used by the policies; and per-job entries only for a drop policy that
singles out jobs (its `select` names a job identity attribute, SINGLING_ATTRS). docs/controller.md "Label scheme".
"""
from __future__ import annotations

import hashlib
import ipaddress
import logging
import re

from .. import labelflows
from ..labelflows import BLOCKED_VID, COMMON_VID, VID_PRESENT
from .config import ControllerConfig, Policy
from .model import JobReg
from .pipeline import ETH_IP, ETH_IP6, T_SLICE, T_WAN, WAN_SHIFT, Flow

log = logging.getLogger(__name__)
ETH_ARP = 0x0806
ANY_TAG = (VID_PRESENT, VID_PRESENT)  # matches any tagged frame
FIRST_SLICE_VID, LAST_SLICE_VID = 2, 4093   # 4,092 slices at most
MAX_PCP = 7
# priorities: table 0 (per EP) and table 1 (per WAN action); above the per-job mode's, below a singled-out drop (400)
P_EP_SOURCE = 320
P_TAGGED_FOREIGN = 310                # a tagged frame no EP's port and range vouch for
P_BLOCKED, P_COMMON, P_TO_JOB, P_OFF_JOB, P_BAD_PCP = 500, 470, 460, 450, 440
# table 1, below the per-job slice flows of an untagged job (300, 290): an untagged job's sliced frame toward a job
# address that no per-job flow admits (a labelled job's: NORMAL would deliver it untagged, outside the slice)
P_SLICED_UNTAGGED = 280
SINGLING_ATTRS = ("LarkJobId", "GlobalJobId", "ClusterId", "ProcId", "JobId")
_SINGLING_RE = re.compile(r"\b(" + "|".join(SINGLING_ATTRS) + r")\b", re.IGNORECASE)


def singles_out(p: Policy) -> bool:
    """Whether a policy picks individual jobs (its expression names a job identity attribute) rather than owners,
    groups or EPs: only such a drop policy gets per-job entries on the core."""
    return bool(_SINGLING_RE.search(p.select))


def vid_probe(slice_name: str):
    """The VLAN ids a slice tries, in order: a stable hash first (the same on every controller), then the next ones."""
    span = LAST_SLICE_VID - FIRST_SLICE_VID + 1
    start = int.from_bytes(hashlib.blake2b(slice_name.encode(), digest_size=4).digest(), "big") % span
    for i in range(span):
        yield FIRST_SLICE_VID + (start + i) % span


def wan_actions(cfg: ControllerConfig) -> list[int]:
    """The WAN actions (PCP values) the policies can give a job: 0 always, then drop and each steered port."""
    acts = {0}
    for p in cfg.policies:
        if p.kind == "wan_drop":
            acts.add(1)
        elif p.kind == "wan_steer":
            acts.add(2 + cfg.wan_ports.index(p.port))
    return sorted(acts)


def _net(n: ipaddress.IPv4Network | ipaddress.IPv6Network) -> tuple[str, str]:
    return (str(n.network_address), str(n.netmask))


def core_flows(cfg: ControllerConfig) -> list[Flow]:
    """The label scheme's flows on the core (added to flows.base_flows; the same on every switch)."""
    flows: list[Flow] = []
    for name in sorted(cfg.eps):
        scope = cfg.eps[name]
        for port in scope.ports:
            at = (("in_port", port), ("vlan_vid", ANY_TAG))
            for n in scope.networks:
                if n.version == 4:
                    flows += [Flow(0, P_EP_SOURCE, (*at, ("eth_type", ETH_IP), ("ipv4_src", _net(n))),
                                   ("goto", T_SLICE, 0, 0)),
                              Flow(0, P_EP_SOURCE, (*at, ("eth_type", ETH_ARP), ("arp_spa", _net(n))),
                                   ("goto", T_SLICE, 0, 0))]
                else:
                    flows.append(Flow(0, P_EP_SOURCE, (*at, ("eth_type", ETH_IP6), ("ipv6_src", _net(n))),
                                      ("goto", T_SLICE, 0, 0)))
    flows.append(Flow(0, P_TAGGED_FOREIGN, (("vlan_vid", ANY_TAG),), ("drop",)))
    flows.append(Flow(T_SLICE, P_BLOCKED, (("vlan_vid", VID_PRESENT | BLOCKED_VID),), ("drop",)))
    job_nets = [ipaddress.ip_network(n) for scope in cfg.eps.values() for n in scope.networks]
    job_nets = list(ipaddress.collapse_addresses([n for n in job_nets if n.version == 4])) + list(
        ipaddress.collapse_addresses([n for n in job_nets if n.version == 6]))
    # Jobs whose EP does not tag them (a Linux-bridge job, JobReg.tagged false) have the per-job flows: their frames
    # come untagged with their slice in the metadata. Toward a job address, only the per-job slice flows (300, 290)
    # let such a frame on; toward a labelled job (no per-job flows) it is dropped here, or NORMAL would deliver it
    # untagged, which every labelled job's EP hands to its jobs. Unsliced untagged frames (metadata 0) went on at 400.
    flows += [Flow(T_SLICE, P_SLICED_UNTAGGED, (("eth_type", ETH_IP), ("ipv4_dst", _net(n))), ("drop",))
              if n.version == 4 else
              Flow(T_SLICE, P_SLICED_UNTAGGED, (("eth_type", ETH_IP6), ("ipv6_dst", _net(n))), ("drop",))
              for n in job_nets]
    for a in wan_actions(cfg):
        md = ("goto", T_WAN, a << WAN_SHIFT, 0xFF << WAN_SHIFT)
        flows.append(Flow(T_SLICE, P_COMMON, (("vlan_vid", VID_PRESENT | COMMON_VID), ("vlan_pcp", a)),
                          ("pop_goto", *md[1:])))
        for n in job_nets:
            if n.version == 4:
                flows += [Flow(T_SLICE, P_TO_JOB, (("vlan_vid", ANY_TAG), ("vlan_pcp", a), ("eth_type", ETH_IP),
                                                  ("ipv4_dst", _net(n))), md),
                          Flow(T_SLICE, P_TO_JOB, (("vlan_vid", ANY_TAG), ("vlan_pcp", a), ("eth_type", ETH_ARP),
                                                  ("arp_tpa", _net(n))), md)]
            else:
                flows.append(Flow(T_SLICE, P_TO_JOB, (("vlan_vid", ANY_TAG), ("vlan_pcp", a), ("eth_type", ETH_IP6),
                                                     ("ipv6_dst", _net(n))), md))
        flows.append(Flow(T_SLICE, P_OFF_JOB, (("vlan_vid", ANY_TAG), ("vlan_pcp", a)), ("pop_goto", *md[1:])))
    flows.append(Flow(T_SLICE, P_BAD_PCP, (("vlan_vid", ANY_TAG),), ("drop",)))   # a WAN action no policy gives
    return flows


def edge_flows(jobs: list[tuple[JobReg, int, int, str]], uplink: str) -> list[str]:
    """What an EP's own switch runs for its jobs, as `ovs-ofctl add-flows` lines (OpenFlow 1.3), on a switch with
    nothing else on it (no NORMAL, no host port): `jobs` are (job, vid, pcp, the job's port) as the controller
    answered. The flows are lark.labelflows', the ones larkd's OVS bridge runs: only the job's own MAC and addresses
    leave its port, tagged with its label; same-EP delivery and multicast obey the labels as the core does between
    EPs; down, a frame tagged with a job's VLAN reaches it untagged, an untagged one every job but a blocked one."""
    return labelflows.edge_flows([labelflows.EdgeJob(job.mac, port, vid, pcp, labelflows.own_up(job.mac, job.ipv4,
                                                                                                 job.ipv6))
                                  for job, vid, pcp, port in jobs], uplink, normal=False)
