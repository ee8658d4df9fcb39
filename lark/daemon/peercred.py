"""Who is asking: kernel-verified peer credentials and the process tree above them."""
from __future__ import annotations

import os
import socket
import struct
from dataclasses import dataclass

from ..kernel import netns
from ..errors import LarkError


@dataclass
class Peer:
    pid: int
    uid: int
    gid: int


@dataclass
class StarterInfo:
    pid: int
    start: int
    slot: str
    exe: str
    argv: list[str]


def peer_of(sock: socket.socket) -> Peer:
    raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, uid, gid = struct.unpack("3i", raw)
    return Peer(pid, uid, gid)


def _stat_fields(pid: int) -> list[str]:
    with open(f"/proc/{pid}/stat") as f:
        data = f.read()
    # comm may contain spaces and parentheses; everything after the last ')' is well-formed.
    return data[data.rindex(")") + 2:].split()


def parent_of(pid: int) -> int:
    return int(_stat_fields(pid)[1])


def start_time(pid: int) -> int:
    return int(_stat_fields(pid)[19])


def real_uid(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("Uid:"):
                return int(line.split()[1])
    raise LarkError("no Uid line", obj=f"/proc/{pid}/status")


def cmdline(pid: int) -> list[str]:
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        return [a.decode(errors="replace") for a in f.read().split(b"\0") if a]


def slot_from_cmdline(argv: list[str]) -> str | None:
    """condor_starter is started as `condor_starter -f [-local-name X] -a <slot> <startd address>`."""
    for i, arg in enumerate(argv[:-1]):
        if arg == "-a":
            return argv[i + 1]
    return None


def alive(pid: int, start: int) -> bool:
    try:
        return start_time(pid) == start
    except (FileNotFoundError, ProcessLookupError, ValueError, IndexError):
        return False


def find_starter(pid: int, starter_paths: list[str], max_depth: int = 32) -> StarterInfo | None:
    """The nearest root-owned ancestor whose executable is a configured starter.

    /proc/<pid>/exe is set by the kernel at exec time and cannot be forged by the job; uid 0 means the job's
    user could not have started it.
    """
    wanted = {os.path.realpath(p) for p in starter_paths}
    cur = pid
    for _ in range(max_depth):
        try:
            cur = parent_of(cur)
        except (FileNotFoundError, ProcessLookupError):
            return None
        if cur <= 1:
            return None
        try:
            exe = os.readlink(f"/proc/{cur}/exe")
            uid = real_uid(cur)
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue
        if exe in wanted and uid == 0:
            argv = cmdline(cur)
            slot = slot_from_cmdline(argv)
            if not slot:
                raise LarkError("starter command line has no -a <slot>", obj=f"starter pid {cur}",
                                fix="check STARTER in the HTCondor configuration")
            return StarterInfo(cur, start_time(cur), slot, exe, argv)
    return None


def authorize_job(peer: Peer, starter_paths: list[str], daemon_netns: int) -> tuple[StarterInfo, int]:
    """Refuse anything that is not a job process in its own netns under a configured starter."""
    try:
        job_ns = netns.netns_inode_of_pid(peer.pid)
    except FileNotFoundError:
        raise LarkError("requesting process vanished", obj=f"pid {peer.pid}") from None
    if job_ns == daemon_netns:
        raise LarkError("request comes from the host's network namespace, not from a job's",
                        obj=f"pid {peer.pid} uid {peer.uid}",
                        fix="only job processes started with NO_JOB_NETWORKING may ask to be networked")
    starter = find_starter(peer.pid, starter_paths)
    if starter is None:
        raise LarkError("requesting process does not descend from a configured starter",
                        obj=f"pid {peer.pid} uid {peer.uid}", fix="check LARK_STARTER_PATHS")
    return starter, job_ns
