"""`lark detect-bandwidth`: the uplink's negotiated speed, for MACHINE_RESOURCE_INVENTORY_Bandwidth."""
from __future__ import annotations

import os

from ..errors import LarkError

SYSFS_NET = "/sys/class/net"


def link_speed_mbit(ifname: str, sysfs_net: str = SYSFS_NET) -> int | None:
    """Negotiated speed (Mbit/s) the driver reports in sysfs; None when it reports none.

    /sys shows the interfaces of the netns it was mounted in: run this in the host's netns (as the startd does).
    """
    try:
        present = ifname in os.listdir(sysfs_net)  # an exact name, never a path
    except FileNotFoundError:
        present = False
    if not present:
        raise LarkError("no such interface", obj=f"uplink {ifname}", fix="set LARK_UPLINK")
    try:
        with open(os.path.join(sysfs_net, ifname, "speed")) as f:
            speed = int(f.read().strip())
    except (OSError, ValueError):  # EINVAL: link down, or a driver that has no notion of speed
        return None
    return speed if speed > 0 else None  # SPEED_UNKNOWN reads as -1


def detect(ifname: str, configured: int) -> int:
    speed = link_speed_mbit(ifname)
    if speed:
        return speed
    if configured > 0:
        return configured
    raise LarkError("the driver reports no link speed (typical of virtual NICs)", obj=f"uplink {ifname}",
                    fix="set LARK_BANDWIDTH_MBIT")
