"""Kernel object names derived from a slot name: one place, so setup, teardown and gc always agree."""
from __future__ import annotations

import hashlib
import ipaddress
import re
from dataclasses import dataclass

from .errors import LarkError

HOST_IF_PREFIX = "lk-"
SLOT_RE = re.compile(r"^[A-Za-z0-9_.@-]{1,128}$")
_SAFE = re.compile(r"^[A-Za-z0-9_]{1,12}$")


def job_key(slot: str) -> str:
    """A short identifier that is safe in interface, nft and file names.

    Slot names come from the starter's command line (root-owned), but are still treated as untrusted text:
    anything outside [A-Za-z0-9_] or longer than 12 characters is replaced by a hash.
    """
    if not SLOT_RE.fullmatch(slot or ""):
        raise LarkError(f"slot name {slot!r} is not valid", obj="starter command line",
                        fix="slot names are letters, digits and _.@-")
    if _SAFE.fullmatch(slot):
        return slot
    return "h" + hashlib.sha256(slot.encode()).hexdigest()[:11]


@dataclass(frozen=True)
class JobNames:
    key: str
    netns_prefix: str = "lark-"

    @property
    def netns(self) -> str:
        return f"{self.netns_prefix}{self.key}"

    @property
    def host_if(self) -> str:
        return f"{HOST_IF_PREFIX}{self.key}"

    @property
    def job_if(self) -> str:
        return "eth0"

    @property
    def nft_id(self) -> str:
        return f"j_{self.key}"

    @property
    def job_mac(self) -> str:
        """The job's MAC on bridged networks: locally administered, unicast, derived from the key so that
        anti-spoofing rules and teardown never need to read it back from the kernel."""
        h = hashlib.sha256(("mac:" + self.key).encode()).digest()
        return "02:" + ":".join(f"{b:02x}" for b in h[:5])


def link_local_of(mac: str) -> str:
    """The EUI-64 link-local address the kernel gives a device with this MAC (addr_gen_mode eui64, the
    default; Lark sets a bridged job's MAC, so its link-local is known without asking the job)."""
    b = bytes.fromhex(mac.replace(":", ""))
    eui = bytes([b[0] ^ 0x02]) + b[1:3] + b"\xff\xfe" + b[3:6]
    return str(ipaddress.IPv6Address(b"\xfe\x80" + b"\0" * 6 + eui))


def key_from_host_if(ifname: str) -> str | None:
    if ifname.startswith(HOST_IF_PREFIX) and len(ifname) > len(HOST_IF_PREFIX):
        return ifname[len(HOST_IF_PREFIX):]
    return None
