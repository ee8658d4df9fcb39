"""`lark detect-bandwidth`: the uplink's negotiated speed, for MACHINE_RESOURCE_INVENTORY_Bandwidth."""
from __future__ import annotations

import array
import fcntl
import socket
import struct

from ..errors import LarkError

SIOCETHTOOL = 0x8946
ETHTOOL_GSET = 0x00000001
SPEED_UNKNOWN = (0xFFFF, 0xFFFFFFFF)


def link_speed_mbit(ifname: str) -> int | None:
    """Negotiated speed from the driver (ethtool ioctl, in the caller's netns); None when it reports none."""
    # struct ethtool_cmd: cmd u32, supported u32, advertising u32, speed u16, duplex u8, ... speed_hi u16 @ 28
    buf = array.array("B", struct.pack("I", ETHTOOL_GSET) + b"\0" * 40)
    ifreq = struct.pack("16sP", ifname.encode()[:15], buf.buffer_info()[0])
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            fcntl.ioctl(s.fileno(), SIOCETHTOOL, ifreq)
        except OSError as e:
            if e.errno == 19:
                raise LarkError("no such interface", obj=f"uplink {ifname}", fix="set uplink in the larkd config") \
                    from None
            return None
    data = buf.tobytes()
    speed = struct.unpack_from("H", data, 12)[0] | (struct.unpack_from("H", data, 28)[0] << 16)
    if speed == 0 or speed in SPEED_UNKNOWN:
        return None
    return speed


def detect(ifname: str, configured: int) -> int:
    speed = link_speed_mbit(ifname)
    if speed:
        return speed
    if configured > 0:
        return configured
    raise LarkError("the driver reports no link speed (typical of virtual NICs)", obj=f"uplink {ifname}",
                    fix="set bandwidth_mbit in the [network] section of the larkd config")
