"""veth plumbing with pyroute2: the host end stays with larkd, the job end is created inside the job's netns."""
from __future__ import annotations

import errno
import ipaddress
import logging
import os
import threading
import time
from typing import NamedTuple, cast, overload

from pyroute2 import IPRoute
from pyroute2.netlink.exceptions import NetlinkError

from ..errors import LarkError
from . import rtnl
from .drift import Finding, drifted, present
from .netns import JobNetlink
from .rtnl import Rtnl

log = logging.getLogger(__name__)
RTNH_F_ONLINK = 4
IFA_F_NODAD = 0x02
IFF_UP = 0x1
VETH_FIX = ("something other than larkd deleted or changed the job's veth (`ip link del/set`, a network manager "
            "that manages lk-* devices)")


class VethIndexes(NamedTuple):
    host: int   # the host end's index (larkd's netns)
    job: int    # the job end's index, in the job's netns


def create_veth(ipr: IPRoute, host_if: str, job_if: str, ns_fd: int, job: str, job_mac: str | None = None,
                mtu: int | None = None) -> VethIndexes | None:
    """The job's veth pair, the host end up; its ends' indexes when larkd's raw socket made it (from the create
    request's echo: no read-back), else None (made through `ipr`, a pyroute2 IPRoute of another netns: look them
    up). The job end's index also goes to this thread's next `bring_up_job_side` in that netns."""
    # Creating the peer directly in the target netns avoids a 20 ms move between namespaces.
    raw = host_rtnl(ipr)
    try:
        if raw is not None:
            made = VethIndexes(*raw.veth_add(host_if, job_if, ns_fd, peer_address=job_mac, mtu=mtu))
            _made.veth = (os.fstat(ns_fd).st_ino, job_if, made.job)
            return made
        peer = {"ifname": job_if, "net_ns_fd": ns_fd}
        if job_mac:
            peer["address"] = job_mac
        extra = {}
        if mtu:  # both ends in the same message (lark/kernel/mtu.py decides it)
            peer["mtu"] = extra["mtu"] = mtu
        ipr.link("add", ifname=host_if, kind="veth", state="up", peer=peer, **extra)
        return None
    except NetlinkError as e:
        if e.code == 17:  # EEXIST: a leftover from a crashed setup of this slot
            raise LarkError("host interface already exists", job=job, obj=host_if,
                            fix="run `lark gc` to remove leftovers of a crashed setup") from None
        raise LarkError(f"cannot create veth pair: {e}", job=job, obj=host_if) from None


# The job end's index of the veth this thread made last: (the job netns's inode, the job end's name, its index).
# A setup's worker thread creates the veth, then brings its job end up through netns.netlink_in in that netns.
_made = threading.local()


def _made_index(nipr: JobNetlink, job_if: str) -> int | None:
    """The job end's index as create_veth's echo gave it, if this thread made `job_if` in `nipr`'s netns (once)."""
    made = getattr(_made, "veth", None)
    _made.veth = None
    if made is not None and made[0] == nipr.ns_inode and made[1] == job_if:
        return int(made[2])
    return None


@overload
def bring_up_job_side(nipr: IPRoute, job_if: str) -> int: ...
@overload
def bring_up_job_side(nipr: IPRoute, job_if: None) -> None: ...
def bring_up_job_side(nipr: IPRoute, job_if: str | None) -> int | None:
    """`lo` and the job's device up (inside the job's netns); the device's index, or None without one."""
    # A new netns always has lo as index 1: one netlink round trip saved per job.
    raw = _raw(nipr)
    if raw is not None:  # larkd's setup: the raw socket of netns.netlink_in (~0.2 ms less per request)
        raw.link_up(1)
        if not job_if:
            return None
        idx = _made_index(cast(JobNetlink, nipr), job_if)
        if idx is None:
            idx = raw.link_index(job_if)
        raw.link_up(idx)
        return idx
    nipr.link("set", index=1, state="up")
    if not job_if:
        return None
    idx = nipr.link_lookup(ifname=job_if)[0]
    nipr.link("set", index=idx, state="up")
    return idx


def _raw(nipr: IPRoute) -> Rtnl | None:
    """The raw rtnetlink socket beside a job netns's IPRoute when netns.netlink_in made it (in the same netns)."""
    return nipr.rtnl if isinstance(nipr, JobNetlink) else None


def host_rtnl(ipr: IPRoute) -> Rtnl | None:
    """A raw rtnetlink socket in the same netns as `ipr` (larkd's host IPRoute), or None (then use `ipr`)."""
    if isinstance(ipr, JobNetlink):
        return ipr.rtnl
    if isinstance(ipr, IPRoute):
        return rtnl.beside(ipr.fileno())
    return None


def index_by_name(ipr: IPRoute, ifname: str) -> int | None:
    """A device's index, None when there is none of that name: on the raw socket beside `ipr` where there is one
    (fair share asks this for every running job at every job's setup: pyroute2's link_lookup costs ~0.15 ms, makes
    a job netns's IPRoute (~0.5 ms), and leaves its ACK queued, lark/kernel/netlink_orphans.py), else through `ipr`."""
    raw = host_rtnl(ipr)
    if raw is None:
        hits = ipr.link_lookup(ifname=ifname)
        return hits[0] if hits else None
    try:
        return raw.link_index(ifname)
    except NetlinkError as e:
        if e.code != errno.ENODEV:
            raise
        return None


BR_STATE_FORWARDING = 3


def wait_bridge_port_forwarding(ipr: IPRoute, idx: int, job: str, timeout: float = 1.0) -> float:
    """Wait until a bridge port forwards; the seconds waited.

    The host end of a job's veth joins the bridge before the job's end is up, without carrier, so the bridge
    keeps the port disabled. Bringing the job's end up gives it carrier, but the bridge learns that from the
    kernel's link watch, which runs later in a work queue (~1 ms here, longer under load): a frame the job sends
    at once (its DHCP DISCOVER, its first ARP) reaches a disabled port and is dropped, and the DHCP client then
    waits for its retry (the benchmark's cold p99 of ~270 ms). A bridge with STP and a forward delay takes
    seconds: past `timeout` this gives up with a warning instead of holding the setup that long.
    """
    t0 = time.monotonic()
    while True:
        link = ipr.get_links(idx)[0]
        state = link.get_nested("IFLA_LINKINFO", "IFLA_INFO_SLAVE_DATA", "IFLA_BRPORT_STATE")
        waited = time.monotonic() - t0
        if state == BR_STATE_FORWARDING or state is None:  # None: not a bridge port (nothing to wait for)
            return waited
        if waited > timeout:
            log.warning("job %s: bridge port %s is not forwarding after %.1f s (state %s; STP with a forward delay?);"
                        " going on", job, link.get_attr("IFLA_IFNAME"), waited, state)
            return waited
        time.sleep(0.0005)


def add_job_address(nipr: IPRoute, idx: int, job_ip: str, prefix: int, gateway: str | None) -> None:
    raw = _raw(nipr)
    if raw is not None:
        raw.addr_add(idx, job_ip, prefix)
        if gateway:
            raw.default_route_add(gateway, idx, RTNH_F_ONLINK)
        return
    nipr.addr("add", index=idx, address=job_ip, prefixlen=prefix)
    if gateway:
        # onlink: the gateway sits on the other end of the veth (or on the bridged network), no host route needed.
        nipr.route("add", dst="0.0.0.0/0", gateway=gateway, oif=idx, flags=RTNH_F_ONLINK)


def add_job_address6(nipr: IPRoute, idx: int, ip6: str, prefix6: int, gateway6: str | None) -> None:
    """IPv6 address without duplicate address detection, and a default route onlink via the gateway."""
    raw = _raw(nipr)
    if raw is not None:
        raw.addr_add(idx, ip6, prefix6, IFA_F_NODAD)
        if gateway6:
            raw.default_route_add(gateway6, idx, RTNH_F_ONLINK)
        return
    nipr.addr("add", index=idx, address=ip6, prefixlen=prefix6, flags=IFA_F_NODAD)
    if gateway6:
        nipr.route("add", dst="::/0", gateway=gateway6, oif=idx, flags=RTNH_F_ONLINK, family=10)


def verify_veth(ipr: IPRoute, host_if: str, nipr: IPRoute | None,
                job_if: str) -> tuple[list[Finding], int | None, int | None]:
    """The pair create_veth made, both ends up and each other's peer (`nipr`: netlink in the job's netns, None when
    that is gone); with the ends' indexes (None: missing) for the checks of what sits on them."""
    found: list[Finding] = []
    hits = ipr.link_lookup(ifname=host_if)
    host_idx = hits[0] if hits else None
    host_peer = None
    if host_idx is None:
        found.append(drifted(f"veth {host_if}", "the job's host-side veth is gone", VETH_FIX))
    else:
        link = ipr.get_links(host_idx)[0]
        kind = link.get_nested("IFLA_LINKINFO", "IFLA_INFO_KIND")
        host_peer = link.get_attr("IFLA_LINK")
        if kind != "veth":
            found.append(drifted(f"veth {host_if}", f"{host_if} is a {kind or 'plain'} device, not the job's veth",
                                 VETH_FIX))
        elif not link["flags"] & IFF_UP:
            found.append(drifted(f"veth {host_if}", f"{host_if} is down", VETH_FIX))
        else:
            found.append(present(f"veth {host_if}"))
    if nipr is None:
        return found, host_idx, None
    obj = f"veth peer {job_if} in the job's netns"
    hits = nipr.link_lookup(ifname=job_if)
    job_idx = hits[0] if hits else None
    if job_idx is None:
        found.append(drifted(obj, f"the job's end of the veth ({job_if}) is gone", VETH_FIX))
    elif not nipr.get_links(job_idx)[0]["flags"] & IFF_UP:
        found.append(drifted(obj, f"{job_if} is down", VETH_FIX))
    elif host_idx is not None and host_peer != job_idx:
        found.append(drifted(obj, f"{job_if} is not the peer of {host_if}", VETH_FIX))
    else:
        found.append(present(obj))
    return found, host_idx, job_idx


def verify_job_address(nipr: IPRoute, idx: int, dev: str, address: str, prefix: int,
                       gateway: str | None) -> list[Finding]:
    """What add_job_address/add_job_address6 put on the job's device: the address, and the default route via the
    gateway when there is one."""
    ip = ipaddress.ip_address(address)
    family = 10 if ip.version == 6 else 2
    fix = "something other than larkd changed addresses or routes in the job's netns (`ip netns exec ... ip addr`)"
    have = {(ipaddress.ip_address(a.get_attr("IFA_ADDRESS")), a["prefixlen"])
            for a in nipr.get_addr(index=idx, family=family)}
    found = [present(f"address {address}/{prefix} on {dev}") if (ip, prefix) in have else
             drifted(f"address {address}/{prefix} on {dev}", "the job's address is not on its device", fix)]
    if gateway:
        gw = ipaddress.ip_address(gateway)
        routes = [r for r in nipr.get_routes(family=family, oif=idx) if r["dst_len"] == 0
                  and r.get_attr("RTA_GATEWAY") and ipaddress.ip_address(r.get_attr("RTA_GATEWAY")) == gw]
        obj = f"default route via {gateway} on {dev}"
        found.append(present(obj) if routes else drifted(obj, "the job's default route is gone", fix))
    return found


def delete_link(ipr: IPRoute, ifname: str) -> bool:
    """Delete a link if present; deleting one end of a veth removes both. Safe to repeat."""
    idx = ipr.link_lookup(ifname=ifname)
    if not idx:
        return False
    try:
        ipr.link("del", index=idx[0])
    except NetlinkError as e:
        if e.code != 19:  # ENODEV: raced with the kernel removing it with its namespace
            raise
    return True


def list_links(ipr: IPRoute, prefix: str) -> list[str]:
    names = []
    for link in ipr.get_links():
        name = link.get_attr("IFLA_IFNAME")
        if name and name.startswith(prefix):
            names.append(name)
    return names


def link_stats(ipr: IPRoute, ifname: str) -> dict | None:
    idx = ipr.link_lookup(ifname=ifname)
    if not idx:
        return None
    stats = ipr.get_links(idx[0])[0].get_attr("IFLA_STATS64")
    return dict(stats) if stats else None


def take_over_uplink(ipr: IPRoute, up: int, br: int, br_name: str, enslave: bool = True) -> None:
    """Move the uplink's IPv4 addresses, default route and MAC to a new bridge, then enslave the uplink, so the
    host keeps its connectivity (and the site's ARP caches see no change) when the uplink joins the bridge."""
    addrs = [(a.get_attr("IFA_ADDRESS"), a["prefixlen"]) for a in ipr.get_addr(index=up, family=2)]
    gws = [r.get_attr("RTA_GATEWAY") for r in ipr.get_routes(family=2, oif=up)
           if r["dst_len"] == 0 and r.get_attr("RTA_GATEWAY")]
    ipr.link("set", index=br, address=ipr.get_links(up)[0].get_attr("IFLA_ADDRESS"))
    if enslave:
        ipr.link("set", index=up, master=br)
    for addr, plen in addrs:
        ipr.addr("del", index=up, address=addr, prefixlen=plen)
        ipr.addr("add", index=br, address=addr, prefixlen=plen)
    ipr.link("set", index=br, state="up")
    for gw in gws:
        try:
            ipr.route("replace", dst="0.0.0.0/0", gateway=gw, oif=br)
        except NetlinkError as e:
            log.warning("could not move the default route via %s to %s: %s", gw, br_name, e)
