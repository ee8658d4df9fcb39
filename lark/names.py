"""Kernel object names: the fixed ones and those derived from a slot name, in one place, so setup, teardown, gc
and the host checks always agree."""
from __future__ import annotations

import hashlib
import ipaddress
import re
from dataclasses import dataclass

from .errors import LarkError

HOST_IF_PREFIX = "lk-"               # host end of every job's veth; gc finds jobs' links by it
DNS_DEVICE = "lkdns0"                # the DNS forwarder's device, holding dns_address (kernel/dns.py)
NFT_JOB_PREFIX = "j_"                # nftables per-job chains, map elements and named counters
DEFAULT_NETNS_PREFIX = "lark-"       # /run/netns/<prefix><key> (config: netns_prefix)
SLOT_RE = re.compile(r"^[A-Za-z0-9_.@-]{1,128}$")
# The slot-key rule, the one place it is written. 12 characters: an interface name holds 15, and the host
# end of a job's veth is HOST_IF_PREFIX + key.
KEY_MAX = 12
KEY_PATTERN = rf"[A-Za-z0-9_]{{1,{KEY_MAX}}}"
KEY_RE = re.compile(rf"^{KEY_PATTERN}$")


def is_job_key(text: str) -> bool:
    """Whether `text` is a key `job_key` can return: safe in interface, nft, iptables and file names."""
    return bool(KEY_RE.fullmatch(text or ""))


def job_key(slot: str) -> str:
    """A short identifier that is safe in interface, nft and file names.

    Slot names come from the starter's command line (root-owned), but are still treated as untrusted text:
    anything outside [A-Za-z0-9_] or longer than KEY_MAX characters is replaced by a hash.
    """
    if not SLOT_RE.fullmatch(slot or ""):
        raise LarkError(f"slot name {slot!r} is not valid", obj="starter command line",
                        fix="slot names are letters, digits and _.@-")
    if KEY_RE.fullmatch(slot):
        return slot
    return "h" + hashlib.sha256(slot.encode()).hexdigest()[:KEY_MAX - 1]


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
    netns_prefix: str = DEFAULT_NETNS_PREFIX
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
        return f"{NFT_JOB_PREFIX}{self.key}"

    @property
    def job_mac(self) -> str:
        """The job's MAC on bridged networks: locally administered, unicast, derived from the key so that
        anti-spoofing rules and teardown never need to read it back from the kernel."""
        seed = _process_mac_seed if self.mac_seed is None else self.mac_seed
        text = f"mac:{seed}:{self.key}" if seed else "mac:" + self.key
        h = hashlib.sha256(text.encode()).digest()
        return "02:" + ":".join(f"{b:02x}" for b in h[:5])


def link_local_of(mac: str) -> str:
    """The EUI-64 link-local address the kernel gives a device with this MAC (addr_gen_mode eui64, the
    default; Lark sets a bridged job's MAC, so its link-local is known without asking the job)."""
    b = bytes.fromhex(mac.replace(":", ""))
    eui = bytes([b[0] ^ 0x02]) + b[1:3] + b"\xff\xfe" + b[3:6]
    return str(ipaddress.IPv6Address(b"\xfe\x80" + b"\0" * 6 + eui))


def key_from_host_if(ifname: str) -> str | None:
    """The job key of a host-side veth name, or None when the name is not one Lark makes."""
    if ifname.startswith(HOST_IF_PREFIX) and is_job_key(ifname[len(HOST_IF_PREFIX):]):
        return ifname[len(HOST_IF_PREFIX):]
    return None
