"""Kernel object names derived from a slot name: one place, so setup, teardown and gc always agree."""
from __future__ import annotations

import hashlib
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


def host_mac_seed(configured: str = "", machine_id: str = "/etc/machine-id") -> str:
    """What makes this EP's job MACs its own: the configured `job_mac_seed`, else the machine id.

    Slot names repeat on every EP, so MACs derived from the slot alone collide between EPs that bridge jobs
    onto one network (found on the pool testbed: two EPs' slot1 jobs with one MAC).
    """
    if configured:
        return configured
    try:
        with open(machine_id) as f:
            return f.read().strip()
    except OSError:
        return ""


_process_mac_seed = ""


def set_process_mac_seed(seed: str) -> None:
    """larkd sets its seed once at start, so every JobNames made in the process (also by code that builds them
    from a key alone, such as the controller client's resync) computes the same MACs."""
    global _process_mac_seed
    _process_mac_seed = seed


@dataclass(frozen=True)
class JobNames:
    key: str
    netns_prefix: str = "lark-"
    mac_seed: str | None = None         # None: the process's seed (set_process_mac_seed); keeps EPs' MACs apart

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
        seed = _process_mac_seed if self.mac_seed is None else self.mac_seed
        text = f"mac:{seed}:{self.key}" if seed else "mac:" + self.key
        h = hashlib.sha256(text.encode()).digest()
        return "02:" + ":".join(f"{b:02x}" for b in h[:5])


def key_from_host_if(ifname: str) -> str | None:
    if ifname.startswith(HOST_IF_PREFIX) and len(ifname) > len(HOST_IF_PREFIX):
        return ifname[len(HOST_IF_PREFIX):]
    return None
