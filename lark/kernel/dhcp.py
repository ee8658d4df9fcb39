"""A small DHCPv4 client that larkd runs on a job's behalf, inside the job's netns (never by the job).

Answers are validated, not trusted: a reply counts only with our xid and our hardware address; the ACK must
come from the server that made the OFFER (and a renewal's from the server that granted the lease), a NAK
counts only from that server; the address must be a usable unicast one, and the lease time must lie within
[MIN_LEASE_S, MAX_LEASE_S] (longer ones are cut to the maximum, so larkd renews; T1 <= T2 <= lease or the
RFC 2131 defaults). Everything else is dropped with a log line, and the client keeps waiting for a valid answer.

One UDP socket bound to port 68 on the job's device does the whole exchange: with the broadcast flag set the
server answers by broadcast, which reaches the socket although the device has no address yet. Renewals and
releases are unicast from the leased address. The lease is plain data (`Lease`), kept in the job's record and
in a per-slot cache so the slot's next job reuses it without a new DISCOVER. Packets are encoded and decoded by
pyroute2's DHCPv4 codec (`dhcp4msg`); its client is not used because it runs a whole interface state machine of
its own, while larkd needs one exchange at a time in another namespace, with the lease cached per slot.

The socket carries `DHCP_MARK`: the job's netns lets no DHCP client message out without it (firewall/job_netns.py),
so only larkd speaks DHCP for the job, never the job itself.
"""
from __future__ import annotations

import contextlib
import hashlib
import ipaddress
import json
import logging
import os
import secrets
import socket
import time
from dataclasses import asdict, dataclass

from pyroute2.dhcp.dhcp4msg import dhcp4msg
from pyroute2.dhcp.enums.dhcp import MessageType

from ..errors import LarkError
from ..statefiles import atomic_write, private_dir, read_own
from .firewall.job_netns import DHCP_MARK

log = logging.getLogger(__name__)
MAGIC = b"\x63\x82\x53\x63"
BOOTP_SIZE = 236  # the fixed BOOTP header; the options cookie (MAGIC) follows
DISCOVER, OFFER, REQUEST, DECLINE, ACK, NAK, RELEASE = 1, 2, 3, 4, 5, 6, 7
# Asked of the server: mask, router, DNS, lease time, server id, T1, T2.
PARAMS = [1, 3, 6, 51, 54, 58, 59]
MIN_LEASE_S = 60                 # shorter: larkd would renew in a loop (or hold an address the server reuses)
MAX_LEASE_S = 30 * 24 * 3600     # longer (or "infinite"): cut, so the lease is still renewed


class BadAnswer(ValueError):
    """A DHCP reply that fails validation: ignored, never used."""


@dataclass
class Lease:
    address: str
    prefix: int
    router: str | None
    server: str
    lease_time: int
    t1: int
    t2: int
    obtained: float          # wall clock, so a cached lease means the same after a larkd restart
    owner: str = ""          # the job owner it was leased for: its client identifier, and who may reuse it

    def renew_due(self, now: float | None = None) -> bool:
        return (now or time.time()) >= self.obtained + self.t1

    def usable(self, now: float | None = None) -> bool:
        # Reuse only before T1: a job then starts with at least half the lease ahead of it.
        return (now or time.time()) < self.obtained + self.t1

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> Lease:
        return cls(**{k: d[k] for k in cls.__dataclass_fields__ if k in d})


def client_id(mac: str, owner: str = "") -> bytes:
    """Option 61. Per owner: a slot's MAC stays the same from job to job, so without this the server would
    hand the next owner the previous owner's address (and whatever the site tied to it)."""
    hw = bytes.fromhex(mac.replace(":", ""))
    if not owner:
        return b"\x01" + hw
    return b"\x00" + hashlib.sha256(f"lark:{owner}:".encode() + hw).digest()[:16]


def build(msg_type: int, xid: int, mac: str, *, ciaddr: str = "0.0.0.0", requested: str | None = None,
          server: str | None = None, broadcast: bool = True, owner: str = "") -> bytes:
    """A client message, encoded by pyroute2's DHCPv4 codec."""
    cid = client_id(mac, owner)
    # pyroute2 takes a type-1 (hardware) identifier as the MAC string, any other type as raw bytes.
    options: dict = {"message_type": MessageType(msg_type),
                     "client_id": {"type": cid[0], "key": mac if cid[0] == 1 else cid[1:]}}
    if requested:
        options["requested_ip"] = requested
    if server:
        options["server_id"] = server
    if msg_type in (DISCOVER, REQUEST):
        options["parameter_list"] = PARAMS
    return dhcp4msg({"op": 1, "xid": xid, "flags": 0x8000 if broadcast else 0, "ciaddr": ciaddr, "chaddr": mac,
                     "options": options}).encode().buf


def parse(data: bytes, mac: str | None = None) -> tuple[int, str, dict] | None:
    """(xid, yiaddr, options by pyroute2's names) of a server reply, or None for anything that is not one (or,
    with `mac`, is addressed to another client's hardware address)."""
    if len(data) < BOOTP_SIZE + 4 or data[0] != 2 or data[BOOTP_SIZE:BOOTP_SIZE + 4] != MAGIC:
        return None
    # Another client's reply (or a job's broadcast looped back to larkd's socket) is dropped on its raw BOOTP
    # header, before the codec's ~70 us decode: htype 1 (Ethernet), hlen 6, chaddr at offset 28.
    if mac is not None and (data[1] != 1 or data[2] != 6 or data[28:34] != bytes.fromhex(mac.replace(":", ""))):
        return None
    try:
        msg = dhcp4msg(buf=data).decode()
    except Exception as e:  # whatever a hostile or broken server sends, it must not take larkd down
        log.debug("undecodable DHCP reply ignored: %s", e)
        return None
    options = msg.get("options") or {}
    # The codec stops at the first option it cannot decode (wrong length, cut off) and keeps the ones before:
    # such a reply is dropped whole, so no lease is made from what is left of it.
    if (msg.offset < len(data) and data[msg.offset] != 255) or "message_type" not in options:
        return None
    return msg["xid"], msg["yiaddr"], options


def lease_from(yiaddr: str, opts: dict, now: float) -> Lease:
    def seconds(name: str, default: int) -> int:
        # RFC 2132 times are unsigned 32-bit (0xffffffff: infinite); pyroute2 decodes them as signed.
        v = opts.get(name)
        return v & 0xFFFFFFFF if isinstance(v, int) else default

    mask = opts.get("subnet_mask") or "255.255.255.0"
    try:
        prefix = ipaddress.IPv4Network(f"0.0.0.0/{mask}").prefixlen
        addr = ipaddress.IPv4Address(yiaddr)
    except ValueError as e:
        raise BadAnswer(f"bad address or mask: {e}") from None
    if not 8 <= prefix <= 30:
        raise BadAnswer(f"netmask {mask} (/{prefix}) leaves no room for a host and a router")
    if addr.is_unspecified or addr.is_multicast or addr.is_loopback or addr.is_reserved or addr.is_link_local:
        raise BadAnswer(f"{yiaddr} is not an address a host may use")
    lease_time = seconds("lease_time", 3600)
    if lease_time < MIN_LEASE_S:
        raise BadAnswer(f"lease time {lease_time} s is below the minimum {MIN_LEASE_S} s")
    if lease_time > MAX_LEASE_S:
        log.warning("DHCP lease time %d s cut to %d s", lease_time, MAX_LEASE_S)
        lease_time = MAX_LEASE_S
    t1, t2 = seconds("renewal_time", lease_time // 2), seconds("rebinding_time", lease_time * 7 // 8)
    if not 0 < t1 <= t2 <= lease_time:
        t1, t2 = lease_time // 2, lease_time * 7 // 8  # RFC 2131 4.4.5 defaults instead of the server's
    routers = opts.get("router") or []
    return Lease(address=yiaddr, prefix=prefix, router=routers[0] if routers else None,
                 server=opts.get("server_id") or "", lease_time=lease_time, t1=t1, t2=t2, obtained=now)


class Client:
    """Speaks for one job device. Create and use it inside the job's netns (see netns.entered)."""

    # Seconds to wait for each try. The first is short: a frame sent right as a new bridge port comes up is
    # sometimes lost, and waiting 1.5 s for that cost the benchmark's worst case 1.5 s.
    WAITS = (0.25, 1.0, 2.0, 4.0)

    def __init__(self, ifname: str, mac: str, job: str, waits: tuple[float, ...] = WAITS, owner: str = ""):
        self.ifname, self.mac, self.job, self.owner = ifname, mac, job, owner
        self.waits = waits
        self.tries = len(waits)

    def _socket(self, bind_ip: str = "0.0.0.0") -> socket.socket:
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_BROADCAST, 1)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_BINDTODEVICE, self.ifname.encode())
        # The job's netns lets DHCP client messages out only with this mark, which no job process can set
        # (firewall/job_netns.py): the job itself cannot release its lease or speak for other clients.
        s.setsockopt(socket.SOL_SOCKET, socket.SO_MARK, DHCP_MARK)
        s.bind((bind_ip, 68))
        return s

    def _exchange(self, s: socket.socket, packet: bytes, dest: str, xid: int, want: set[int],
                  server: str | None = None) -> tuple[int, str, dict]:
        """Send, and wait for a valid reply of a wanted type (from `server` when given)."""
        for wait in self.waits:
            s.sendto(packet, (dest, 67))
            deadline = time.monotonic() + wait
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                s.settimeout(left)
                try:
                    data = s.recv(4096)
                except TimeoutError:
                    break
                got = parse(data, self.mac)
                if not got or got[0] != xid:
                    continue
                mtype = int(got[2]["message_type"])
                sid = got[2].get("server_id")
                if not sid or (server is not None and sid != server):
                    log.warning("job %s: ignored a DHCP reply (type %d) from server %s, not %s", self.job, mtype,
                                sid or "(no server id)", server or "any")
                    continue
                if mtype == NAK:
                    raise LarkError("the DHCP server refused the request (NAK)", job=self.job, obj=self.ifname,
                                    fix="check the DHCP server's range and leases")
                if mtype in want:
                    return mtype, got[1], got[2]
        raise LarkError(f"no DHCP answer after {self.tries} tries", job=self.job, obj=self.ifname,
                        fix="check that a DHCP server serves the bridged network (and answers this MAC)")

    def _lease(self, yiaddr: str, opts: dict, want_address: str | None) -> Lease:
        if want_address is not None and yiaddr != want_address:
            raise BadAnswer(f"ACK for {yiaddr}, but {want_address} was requested")
        lease = lease_from(yiaddr, opts, time.time())
        lease.owner = self.owner
        return lease

    def _until_valid(self, s: socket.socket, packet: bytes, dest: str, xid: int, want: set[int],
                     server: str | None, address: str | None) -> tuple[str, dict, Lease]:
        """An exchange whose answer also passes lease validation (OFFERs are checked as leases too); a
        bad answer is ignored and the exchange goes on, within the same tries."""
        for _ in range(self.tries):
            mtype, yiaddr, opts = self._exchange(s, packet, dest, xid, want, server)
            try:
                return yiaddr, opts, self._lease(yiaddr, opts, address)
            except BadAnswer as e:
                log.warning("job %s: ignored a DHCP %s: %s", self.job, "OFFER" if mtype == OFFER else "ACK", e)
        raise LarkError("the DHCP server's answers were not valid (see larkd's log)", job=self.job, obj=self.ifname,
                        fix=f"check the DHCP server: lease times of {MIN_LEASE_S} s or more, a usable address")

    def acquire(self) -> Lease:
        """DISCOVER, OFFER, REQUEST, ACK; the ACK must come from the server that made the OFFER, for the
        offered address."""
        xid = secrets.randbits(32)
        with self._socket() as s:
            offered, opts, _ = self._until_valid(s, build(DISCOVER, xid, self.mac, owner=self.owner),
                                                 "255.255.255.255", xid, {OFFER}, None, None)
            server = opts["server_id"]
            _, _, lease = self._until_valid(s, build(REQUEST, xid, self.mac, requested=offered, server=server,
                                                     owner=self.owner), "255.255.255.255", xid, {ACK}, server,
                                            offered)
        return lease

    def renew(self, lease: Lease) -> Lease:
        """RENEWING: unicast REQUEST from the leased address to the server that granted it, whose ACK (for
        the same address) is the only one that counts."""
        xid = secrets.randbits(32)
        self.owner = lease.owner
        with self._socket(lease.address) as s:
            _, _, new = self._until_valid(s, build(REQUEST, xid, self.mac, ciaddr=lease.address, broadcast=False,
                                                   owner=lease.owner), lease.server, xid, {ACK}, lease.server,
                                          lease.address)
        return new

    def release(self, lease: Lease) -> None:
        with self._socket(lease.address) as s:
            s.sendto(build(RELEASE, secrets.randbits(32), self.mac, ciaddr=lease.address, server=lease.server,
                           broadcast=False, owner=lease.owner), (lease.server, 67))


class LeaseCache:
    """One lease per slot key, in files that survive larkd restarts (the server keeps the binding anyway).
    Keyed by slot and owner: a lease is only handed to a job of the owner it was leased for."""

    def __init__(self, directory: str):
        self.dir = directory

    def path(self, key: str, owner: str = "") -> str:
        if not owner:
            return os.path.join(self.dir, f"{key}.lease")
        return os.path.join(self.dir, f"{key}.{hashlib.sha256(owner.encode()).hexdigest()[:16]}.lease")

    def get(self, key: str, owner: str = "") -> Lease | None:
        try:
            lease = Lease.from_dict(json.loads(read_own(self.path(key, owner))))
        except (OSError, ValueError, KeyError, TypeError):
            return None
        return lease if lease.owner == owner else None

    def put(self, key: str, lease: Lease) -> None:
        # A unique temp name per writer, O_NOFOLLOW, and reads only of larkd's own files (lark/statefiles.py).
        private_dir(self.dir)
        atomic_write(self.path(key, lease.owner), json.dumps(lease.to_dict()))

    def drop(self, key: str, owner: str = "") -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path(key, owner))
