"""Port isolation for bridged jobs (`bridge_isolate_jobs`): jobs on one EP reach each other only through the uplink.

An isolated bridge port (IFLA_BRPORT_ISOLATED, kernel >= 4.18) forwards only to ports that are not isolated: the
uplink and the host. The pool's core switch applies its policies to the frame and sends the allowed ones back out
the EP's port (lark.controller.hairpin). Those come back into the bridge from the uplink with a job's source MAC,
and the bridge would move the job's FDB entry to the uplink (it moves learned and plain static entries alike), so
the job's MAC is pinned to its port with a static sticky entry (NTF_STICKY). The entry goes with the port when the
veth is deleted: teardown has nothing to undo. docs/design.md has the reasoning.
"""
from __future__ import annotations

import logging

from pyroute2 import IPRoute
from pyroute2.netlink.exceptions import NetlinkError
from pyroute2.netlink.rtnl.ndmsg import NTF_MASTER, NTF_STICKY, NUD_NOARP

from ...errors import LarkError

log = logging.getLogger(__name__)


def isolate_port(ipr: IPRoute, port_idx: int, mac: str, job_id: str, bridge: str) -> None:
    """Mark the job's bridge port isolated and pin `mac` to it; raise a LarkError when the kernel did not."""
    port = f"bridge port of job {job_id} on {bridge}"
    try:
        ipr.brport("set", index=port_idx, isolated=1)
        # static (NUD_NOARP) and sticky: never ages out and never moves; not "permanent", which would make the
        # bridge deliver frames for this MAC to the host itself.
        ipr.fdb("replace", ifindex=port_idx, lladdr=mac, state=NUD_NOARP, flags=NTF_MASTER | NTF_STICKY)
    except NetlinkError as e:
        raise LarkError(f"the kernel refused port isolation or a sticky FDB entry: {e}", job=job_id, obj=port,
                        fix="needs kernel >= 4.18 (isolated ports) and >= 5.0 (sticky FDB entries); "
                            "or set bridge_isolate_jobs = false") from None
    if not is_isolated(ipr, port_idx) or mac.lower() not in pinned_macs(ipr, port_idx):
        raise LarkError("the kernel did not keep the port isolated with the job's MAC pinned (too old a kernel?)",
                        job=job_id, obj=port, fix="use kernel >= 5.0, or set bridge_isolate_jobs = false")
    log.debug("job %s: bridge port %d isolated, %s pinned to it", job_id, port_idx, mac)


def is_isolated(ipr: IPRoute, port_idx: int) -> bool:
    link = ipr.get_links(port_idx)[0]
    return link.get_nested("IFLA_LINKINFO", "IFLA_INFO_SLAVE_DATA", "IFLA_BRPORT_ISOLATED") == 1


def pinned_macs(ipr: IPRoute, port_idx: int) -> set[str]:
    """MACs with a static sticky entry on the port."""
    return {str(e.get_attr("NDA_LLADDR")).lower() for e in ipr.fdb("dump", ifindex=port_idx)
            if e["state"] & NUD_NOARP and e["flags"] & NTF_STICKY}
