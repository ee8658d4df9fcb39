"""A registered job as the controller sees it: validated from larkd's JSON, with its cookie."""
from __future__ import annotations

import hashlib
import ipaddress
import math
import re
from dataclasses import asdict, dataclass, field

from ..errors import LarkError

MAC_RE = re.compile(r"^[0-9a-f]{2}(:[0-9a-f]{2}){5}$")
NAME_RE = re.compile(r"^[\w.@+-]{0,255}$")
# An IPv4 address already in its one canonical text (what str(ipaddress.ip_address(a)) gives back): taken as it is.
# ipaddress parsing every address was 5% of a registration's CPU under the capacity bench (docs/controller.md).
_OCTET = r"(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"
CANONICAL_IPV4_RE = re.compile(rf"{_OCTET}(?:\.{_OCTET}){{3}}")
JOB_COOKIE_TAG = 0x4A << 56           # top byte of every job cookie ("J"): reconciliation lists by this prefix
COOKIE_TAG_MASK = 0xFF << 56
BASE_COOKIE = 0x4C41524B00000000      # "LARK": the controller's own per-switch flows


class Refused(LarkError):
    """A valid request the controller will not carry out (the API answers with `status` and the reason)."""
    status = 403


class OverQuota(Refused):
    status = 429


def _plain_number(v: object) -> bool:
    """A JSON number that is one (true/false are ints to Python; NaN and Infinity are floats to json.loads)."""
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


@dataclass(slots=True)   # 100,000 registered jobs: no __dict__ per job (issue 26 capacity)
class JobReg:
    ep: str                       # the EP's certificate name (authoritative, set by the API from the TLS peer)
    key: str                      # larkd's job key (one per slot): a slot holds one job at a time
    job_id: str
    owner: str = ""
    accounting_group: str = ""
    addresses: list[str] = field(default_factory=list)
    mac: str = ""
    vlan: int | None = None
    request_bandwidth_mbit: float = 0.0
    attrs: dict = field(default_factory=dict)
    # [labels] mode = "vlan": whether the EP's switch tags the job's frames with the label it is answered (larkd's OVS
    # mode does); an EP that cannot (a Linux-bridge job) says false, and the job gets the per-job flows on the core
    tagged: bool = True

    @property
    def ident(self) -> tuple[str, str]:
        return (self.ep, self.key)

    @property
    def name(self) -> str:
        """How logs and errors name the job."""
        return f"{self.job_id} ({self.owner or '?'} on {self.ep})"

    @property
    def cookie(self) -> int:
        # A new job in the same slot gets a new cookie, so its predecessor's flows can never be mistaken for it.
        h = hashlib.blake2b(f"{self.ep}\0{self.key}\0{self.job_id}".encode(), digest_size=7).digest()
        return JOB_COOKIE_TAG | int.from_bytes(h, "big")

    # An address's text tells its family (every IPv6 form has a colon, no IPv4 one has): parsing each address again
    # for every flow of every job was 18% of the controller's time in a 100,000-job resync (issue 26 capacity).
    @property
    def ipv4(self) -> list[str]:
        return [a for a in self.addresses if ":" not in a]

    @property
    def ipv6(self) -> list[str]:
        return [a for a in self.addresses if ":" in a]

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_wire(cls, data: object, ep: str) -> JobReg:
        """Validate a registration from larkd; `ep` comes from the client's certificate, never from the body."""
        if not isinstance(data, dict):
            raise LarkError("a registration must be a JSON object", obj=f"registration from {ep}")
        job = str(data.get("job_id", "?"))

        def bad(what: str, fix: str) -> LarkError:
            return LarkError(what, job=job, obj=f"registration from {ep}", fix=fix)

        for k in ("key", "job_id", "owner", "accounting_group"):
            v = data.get(k, "")
            if not isinstance(v, str) or not NAME_RE.fullmatch(v) or (k in ("key", "job_id") and not v):
                raise bad(f"{k} = {v!r} is missing or not a plain name", "send letters, digits and ._@+-")
        mac = data.get("mac", "")
        mac = mac.lower() if isinstance(mac, str) else ""
        if not MAC_RE.fullmatch(mac):
            raise bad(f"mac = {data.get('mac')!r} is not a MAC address", "send the job device's MAC, aa:bb:..")
        addrs = data.get("addresses", [])
        if not isinstance(addrs, list) or not addrs or len(addrs) > 8 or not all(isinstance(a, str) for a in addrs):
            raise bad("addresses must be a list of 1-8 address strings", "register after the job's addresses are known")
        try:
            addrs = [a if CANONICAL_IPV4_RE.fullmatch(a) else str(ipaddress.ip_address(a)) for a in addrs]
        except ValueError as e:
            raise bad(str(e), "send plain IPv4/IPv6 addresses without prefix length") from None
        vlan = data.get("vlan")
        if vlan is not None and (not isinstance(vlan, int) or isinstance(vlan, bool) or not 1 <= vlan <= 4094):
            raise bad(f"vlan = {vlan!r} is not a VLAN id", "send 1-4094 or null")
        bw = data.get("request_bandwidth_mbit", 0.0) or 0.0
        if not _plain_number(bw) or bw < 0:
            raise bad(f"request_bandwidth_mbit = {bw!r} is not a rate", "send Mbit/s as a number")
        tagged = data.get("tagged", True)
        if not isinstance(tagged, bool):
            raise bad(f"tagged = {tagged!r} is not a boolean", "send true (the EP tags the job's frames) or false")
        attrs = data.get("attrs", {}) or {}
        if not isinstance(attrs, dict) or len(attrs) > 64 or any(
                not isinstance(k, str) or not re.fullmatch(r"[A-Za-z_]\w{0,99}", k)
                or not isinstance(v, (str, int, float, bool)) or (isinstance(v, str) and len(v) > 1024)
                or (isinstance(v, float) and not math.isfinite(v))
                for k, v in attrs.items()):
            raise bad("attrs must map up to 64 attribute names to plain values", "send strings, numbers, booleans")
        return cls(ep=ep, key=data["key"], job_id=data["job_id"], owner=data.get("owner", ""),
                   accounting_group=data.get("accounting_group", ""), addresses=addrs, mac=mac, vlan=vlan,
                   request_bandwidth_mbit=float(bw), attrs=dict(attrs), tagged=tagged)
