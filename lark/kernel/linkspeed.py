"""`lark detect-bandwidth`: the uplink's negotiated speed, for MACHINE_RESOURCE_INVENTORY_Bandwidth.

Read through pyroute2's ethtool (netlink, or the ioctl on older kernels), which asks the kernel in the caller's
network namespace. /sys/class/net/IF/speed would not do: sysfs shows the namespace it was mounted in, and an EP
whose HTCondor runs in a namespace of its own (the testbed) would read another namespace's interfaces there.
"""
from __future__ import annotations

from ..errors import LarkError


def link_speed_mbit(ifname: str) -> int | None:
    """Negotiated speed (Mbit/s) the driver reports; None when it reports none (virtual NICs, links down)."""
    from pyroute2.ethtool import Ethtool
    from pyroute2.ethtool.ioctl import NoSuchDevice, NotSupportedError
    ethtool = Ethtool()
    try:
        mode = ethtool.get_link_mode(ifname)
    except NoSuchDevice:
        raise LarkError("no such interface", obj=f"uplink {ifname}", fix="set LARK_UPLINK") from None
    except (NotSupportedError, OSError):
        return None
    finally:
        ethtool.close()
    speed = mode.speed
    return speed if isinstance(speed, int) and 0 < speed < 0xFFFFFFFF else None  # SPEED_UNKNOWN is all ones


def detect(ifname: str, configured: int) -> int:
    speed = link_speed_mbit(ifname)
    if speed:
        return speed
    if configured > 0:
        return configured
    raise LarkError("the driver reports no link speed (typical of virtual NICs)", obj=f"uplink {ifname}",
                    fix="set LARK_BANDWIDTH_MBIT")
