"""A small DHCPv4 client that larkd runs on a job's behalf, inside the job's netns (never by the job).

One UDP socket bound to port 68 on the job's device does the whole exchange: with the broadcast flag set the
server answers by broadcast, which reaches the socket although the device has no address yet. Renewals and
releases are unicast from the leased address. The lease is plain data (`Lease`), kept in the job's record and
in a per-slot cache so the slot's next job reuses it without a new DISCOVER. Packets are encoded and decoded by
pyroute2's DHCPv4 codec; its client (`pyroute2.dhcp`) is not used because it runs a whole interface state machine
of its own, while larkd needs one exchange at a time in another namespace, with the lease cached per slot.
"""
from __future__ import annotations

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
from ..statefiles import atomic_write

log = logging.getLogger(__name__)
MAGIC = b"\x63\x82\x53\x63"
BOOTP_SIZE = 236  # fixed BOOTP header; the options cookie (MAGIC) follows
DISCOVER, OFFER, REQUEST, DECLINE, ACK, NAK, RELEASE = 1, 2, 3, 4, 5, 6, 7
# Asked of the server: mask, router, DNS, lease time, server id, T1, T2.
PARAMS = [1, 3, 6, 51, 54, 58, 59]


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

    def renew_due(self, now: float | None = None) -> bool:
        return (now or time.time()) >= self.obtained + self.t1

    def usable(self, now: float | None = None) -> bool:
        # Reuse only before T1: a job then starts with at least half the lease ahead of it.
        return (now or time.time()) < self.obtained + self.t1

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "Lease":
        return cls(**{k: d[k] for k in cls.__dataclass_fields__})


def build(msg_type: int, xid: int, mac: str, *, ciaddr: str = "0.0.0.0", requested: str | None = None,
          server: str | None = None, broadcast: bool = True) -> bytes:
    """A client message, encoded by pyroute2's DHCPv4 codec."""
    options: dict = {"message_type": MessageType(msg_type), "client_id": {"type": 1, "key": mac}}
    if requested:
        options["requested_ip"] = requested
    if server:
        options["server_id"] = server
    if msg_type in (DISCOVER, REQUEST):
        options["parameter_list"] = PARAMS
    return dhcp4msg({"op": 1, "xid": xid, "flags": 0x8000 if broadcast else 0, "ciaddr": ciaddr, "chaddr": mac,
                     "options": options}).encode().buf


def parse(data: bytes) -> tuple[int, str, dict] | None:
    """(xid, yiaddr, options by pyroute2's names) of a server reply, or None for anything that is not one."""
    if len(data) < BOOTP_SIZE + 4 or data[0] != 2 or data[BOOTP_SIZE:BOOTP_SIZE + 4] != MAGIC:
        return None
    try:
        msg = dhcp4msg(buf=data).decode()
    except Exception as e:  # whatever a hostile or broken server sends, it must not take larkd down
        log.debug("undecodable DHCP reply ignored: %s", e)
        return None
    options = msg.get("options") or {}
    if "message_type" not in options:
        return None
    return msg["xid"], msg["yiaddr"], options


def lease_from(yiaddr: str, opts: dict, now: float) -> Lease:
    def seconds(name: str, default: int) -> int:
        v = opts.get(name)
        return v if isinstance(v, int) and v > 0 else default

    mask = opts.get("subnet_mask") or "255.255.255.0"
    routers = opts.get("router") or []
    lease_time = seconds("lease_time", 3600)
    return Lease(address=yiaddr, prefix=ipaddress.IPv4Network(f"0.0.0.0/{mask}").prefixlen,
                 router=routers[0] if routers else None, server=opts.get("server_id") or "", lease_time=lease_time,
                 t1=seconds("renewal_time", lease_time // 2), t2=seconds("rebinding_time", lease_time * 7 // 8),
                 obtained=now)


class Client:
    """Speaks for one job device. Create and use it inside the job's netns (see netns.entered)."""

    # Seconds to wait for each try. The first is short: a frame sent right as a new bridge port comes up is
    # sometimes lost, and waiting 1.5 s for that cost the benchmark's worst case 1.5 s.
    WAITS = (0.25, 1.0, 2.0, 4.0)

    def __init__(self, ifname: str, mac: str, job: str, waits: tuple[float, ...] = WAITS):
        self.ifname, self.mac, self.job = ifname, mac, job
        self.waits = waits
        self.tries = len(waits)

    def _socket(self, bind_ip: str = "0.0.0.0") -> socket.socket:
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_BROADCAST, 1)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_BINDTODEVICE, self.ifname.encode())
        s.bind((bind_ip, 68))
        return s

    def _exchange(self, s: socket.socket, packet: bytes, dest: str, xid: int, want: set[int]) -> tuple[int, str, dict]:
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
                except socket.timeout:
                    break
                got = parse(data)
                if not got or got[0] != xid:
                    continue
                mtype = int(got[2]["message_type"])
                if mtype == NAK:
                    raise LarkError("the DHCP server refused the request (NAK)", job=self.job, obj=self.ifname,
                                    fix="check the DHCP server's range and leases")
                if mtype in want:
                    return mtype, got[1], got[2]
        raise LarkError(f"no DHCP answer after {self.tries} tries", job=self.job, obj=self.ifname,
                        fix="check that a DHCP server serves the bridged network (and answers this MAC)")

    def acquire(self) -> Lease:
        """DISCOVER, OFFER, REQUEST, ACK."""
        xid = secrets.randbits(32)
        with self._socket() as s:
            _, offered, opts = self._exchange(s, build(DISCOVER, xid, self.mac), "255.255.255.255", xid, {OFFER})
            server = opts.get("server_id")
            _, yiaddr, opts = self._exchange(s, build(REQUEST, xid, self.mac, requested=offered, server=server),
                                             "255.255.255.255", xid, {ACK})
        return lease_from(yiaddr, opts, time.time())

    def renew(self, lease: Lease) -> Lease:
        """RENEWING: unicast REQUEST from the leased address to the server that granted it."""
        xid = secrets.randbits(32)
        with self._socket(lease.address) as s:
            _, yiaddr, opts = self._exchange(s, build(REQUEST, xid, self.mac, ciaddr=lease.address, broadcast=False),
                                             lease.server, xid, {ACK})
        return lease_from(yiaddr, opts, time.time())

    def release(self, lease: Lease) -> None:
        with self._socket(lease.address) as s:
            s.sendto(build(RELEASE, secrets.randbits(32), self.mac, ciaddr=lease.address, server=lease.server,
                           broadcast=False), (lease.server, 67))


class LeaseCache:
    """One lease per slot key, in files that survive larkd restarts (the server keeps the binding anyway)."""

    def __init__(self, directory: str):
        self.dir = directory

    def path(self, key: str) -> str:
        return os.path.join(self.dir, f"{key}.lease")

    def get(self, key: str) -> Lease | None:
        try:
            with open(self.path(key)) as f:
                return Lease.from_dict(json.load(f))
        except (FileNotFoundError, ValueError, KeyError, TypeError):
            return None

    def put(self, key: str, lease: Lease) -> None:
        os.makedirs(self.dir, mode=0o700, exist_ok=True)
        atomic_write(self.path(key), json.dumps(lease.to_dict()))

    def drop(self, key: str) -> None:
        try:
            os.unlink(self.path(key))
        except FileNotFoundError:
            pass
