"""The MTU of a job's link: what the network behind it carries, not the kernel's 1500 default.

A bridged job behind a 1450-byte overlay uplink at 1500 sends frames the bridge silently drops at the uplink
(no router sits in between to say "fragmentation needed"); behind a 9000-byte HPC uplink it wastes throughput
and, as a bridge port, pulls the whole bridge (the host's own address included) down to 1500. The CNI bridge
plugin and netavark take the MTU from the network's config or, by default, from the interface of the default
route; Lark does the same per mode: bridged jobs follow the device they are attached to (the bridge, whose
MTU is its smallest port, or the OVS uplink), NAT jobs follow the route out (its `mtu` metric if it has one,
else its device). `job_mtu` overrides all of it.
"""
from __future__ import annotations

import errno
import logging
import socket
from typing import Protocol

from pyroute2 import IPRoute
from pyroute2.netlink.exceptions import NetlinkError

from .links import host_rtnl
from .sections import MtuSection

log = logging.getLogger(__name__)
DEFAULT = 1500


def device_mtu(ipr: IPRoute, ifname: str) -> int | None:
    if not ifname:
        return None
    raw = host_rtnl(ipr)  # raw rtnetlink where it is in ipr's netns: ~0.01 ms a request against pyroute2's ~0.3
    try:  # one request by name (a lookup of the index, then a get by index, took two)
        if raw is not None:
            return raw.link_mtu(ifname=ifname)
        return ipr.link("get", ifname=ifname)[0].get_attr("IFLA_MTU")
    except NetlinkError as e:
        if e.code == errno.ENODEV:
            return None
        raise


def route_out_mtu(ipr: IPRoute, uplink: str) -> int | None:
    """MTU of the IPv4 default route: its `mtu` metric, else its device's; the uplink's without one."""
    raw = host_rtnl(ipr)
    if raw is not None:
        for metric, oif in raw.default_routes(socket.AF_INET):
            if metric:
                return metric
            if oif:
                return raw.link_mtu(index=oif)
        return device_mtu(ipr, uplink)
    for r in ipr.get_default_routes(family=2):
        metrics = r.get_attr("RTA_METRICS")
        if metrics is not None and metrics.get_attr("RTAX_MTU"):
            return metrics.get_attr("RTAX_MTU")
        oif = r.get_attr("RTA_OIF")
        if oif:
            return ipr.get_links(oif)[0].get_attr("IFLA_MTU")
    return device_mtu(ipr, uplink)


class MtuSource(Protocol):
    def link_mtu(self, ipr: IPRoute) -> int | None: ...


def for_job(ipr: IPRoute, cfg: MtuSection, mode: MtuSource) -> int:
    """The MTU both ends of a job's veth get: `job_mtu`, else what the job's attach mode says (AttachMode.link_mtu:
    the bridge, the OVS uplink, or the route out)."""
    if cfg.job_mtu:
        return cfg.job_mtu
    return mode.link_mtu(ipr) or DEFAULT
