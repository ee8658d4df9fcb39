"""Who is asking: kernel-verified peer credentials and the process tree above them."""
from __future__ import annotations

import fcntl
import os
import signal
import socket
import struct
from dataclasses import dataclass, field

from ..errors import LarkError

NS_GET_USERNS = 0xB701   # _IO(0xb7, 0x1): the user namespace that owns a namespace, as a new fd
SO_PEERPIDFD = 77        # Linux >= 6.5: a pidfd for the process that connected (not in Python 3.11's socket)


@dataclass
class Peer:
    pid: int
    uid: int
    gid: int
    # A pidfd for the connecting process, taken by the kernel at connect time: everything read about `pid`
    # from /proc is trusted only if this pidfd still names a live process afterwards (pid reuse).
    pidfd: int | None = field(default=None, compare=False)
    # The process's start time (/proc/<pid>/stat, clock ticks since boot), read as the connection is accepted:
    # the identity on kernels without SO_PEERPIDFD (< 6.5), where a process reusing the pid has another start
    # time. peer_of always sets it (-1 when the process was already gone, which no process matches).
    start: int | None = None

    def close(self) -> None:
        if self.pidfd is not None:
            os.close(self.pidfd)
            self.pidfd = None


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
    pidfd = peer_pidfd(sock)
    try:
        start = start_time(pid)
    except (FileNotFoundError, ProcessLookupError, ValueError, IndexError):
        start = -1   # gone already: still_same_process refuses it
    return Peer(pid, uid, gid, pidfd, start)


def peer_pidfd(sock: socket.socket) -> int | None:
    """SO_PEERPIDFD where the kernel has it (>= 6.5); None on older kernels (then only the bare pid is known)."""
    try:
        raw = sock.getsockopt(socket.SOL_SOCKET, SO_PEERPIDFD, struct.calcsize("i"))
    except OSError:
        return None
    return struct.unpack("i", raw)[0]


def pidfd_alive(pidfd: int) -> bool:
    """Whether the process a pidfd names still runs (signal 0 through the pidfd: ESRCH once it exited,
    whatever process now holds its pid)."""
    try:
        signal_pidfd(pidfd, 0)
        return True
    except ProcessLookupError:
        return False


def signal_pidfd(pidfd: int, sig: int) -> None:
    signal.pidfd_send_signal(pidfd, sig)


def identity_fallback() -> str:
    """How larkd tells the requesting process from one that reuses its pid, on this kernel (`lark doctor`)."""
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        pidfd = peer_pidfd(a)
    finally:
        a.close()
        b.close()
    if pidfd is not None:
        os.close(pidfd)
        return ""
    return "process start time (/proc/<pid>/stat), read when the connection is accepted and compared again"


def still_same_process(peer: Peer) -> None:
    """Refuse if the peer exited after connecting: its pid may now be another process, so what /proc said
    about that pid cannot be attributed to the peer. The pidfd where the kernel gave one; the start time
    captured at connect on every kernel (the only check on kernels without SO_PEERPIDFD)."""
    gone = peer.pidfd is not None and not pidfd_alive(peer.pidfd)
    if not gone and peer.start is not None and not alive(peer.pid, peer.start):
        gone = True
    if gone:
        raise LarkError("requesting process exited while its request was checked (its pid may now name "
                        "another process)", obj=f"pid {peer.pid}", fix="a job's wrapper must wait for larkd's answer")


def own_userns_inode() -> int:
    return os.stat("/proc/self/ns/user").st_ino


def netns_identity(pid: int) -> tuple[int, int]:
    """(inode of the process's network namespace, inode of the user namespace that owns it)."""
    fd = os.open(f"/proc/{pid}/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    try:
        ns_ino = os.fstat(fd).st_ino
        user_fd = fcntl.ioctl(fd, NS_GET_USERNS, 0)
        try:
            return ns_ino, os.fstat(user_fd).st_ino
        finally:
            os.close(user_fd)
    finally:
        os.close(fd)


def _read_proc(path: str) -> bytes:
    """A /proc file's bytes through os.read: every request reads a dozen of them (peer_of, the starter walk,
    still_same_process), and a text-mode open() of /proc/<pid>/stat took 36 us where os.open + os.read took 9."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        chunks = []
        while chunk := os.read(fd, 4096):
            chunks.append(chunk)
    finally:
        os.close(fd)
    return b"".join(chunks)


def _stat_fields(pid: int) -> list[bytes]:
    data = _read_proc(f"/proc/{pid}/stat")
    # comm may contain spaces and parentheses; everything after the last ')' is well-formed.
    return data[data.rindex(b")") + 2:].split()


def resolved_path(path: str) -> str:
    """Where `path` leads, as /proc/<pid>/exe would name that file: the kernel's own path of it (opened O_PATH, its
    /proc/self/fd link read), the same d_path the exe links are compared against. os.path.realpath resolves it one
    lstat per component in Python, which cost a third of each request's starter walk; it stays for a path that
    does not open (a missing starter), where it gives what it always gave."""
    try:
        fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
    except OSError:
        return os.path.realpath(path)
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    finally:
        os.close(fd)


def parent_and_start(pid: int) -> tuple[int, int]:
    """(parent pid, start time) from one read of /proc/<pid>/stat: both about the same process."""
    fields = _stat_fields(pid)
    return int(fields[1]), int(fields[19])


def parent_of(pid: int) -> int:
    return int(_stat_fields(pid)[1])


def start_time(pid: int) -> int:
    return int(_stat_fields(pid)[19])


def real_uid(pid: int) -> int:
    for line in _read_proc(f"/proc/{pid}/status").splitlines():
        if line.startswith(b"Uid:"):
            return int(line.split()[1])
    raise LarkError("no Uid line", obj=f"/proc/{pid}/status")


def cmdline(pid: int) -> list[str]:
    return [a.decode(errors="replace") for a in _read_proc(f"/proc/{pid}/cmdline").split(b"\0") if a]


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


def pidfd_of_live(pid: int, start: int) -> int | None:
    """A pidfd of the process (pid, start), or None when it has ended: a pid reused after it ended gives no pidfd of
    the newcomer (the start time is checked after the pidfd is open)."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return None
    if not alive(pid, start):
        os.close(fd)
        return None
    return fd


def find_starter(pid: int, starter_paths: list[str], max_depth: int = 32) -> StarterInfo | None:
    """The nearest root-owned ancestor whose executable is a configured starter, pinned by its start time.

    /proc/<pid>/exe is set by the kernel at exec time and cannot be forged by the job; uid 0 means the job's
    user could not have started it. Pid reuse along the walk: an ancestor started no later than its
    descendant, while a process that took a dead ancestor's pid started after it died, so after everything
    below it began; and the starter's start time is read before and after its exe, uid and command line, so
    all of them are about one process. The caller checks that `pid` itself is still its requester
    (still_same_process) after this returns.
    """
    wanted = {resolved_path(p) for p in starter_paths}
    # Each process's stat is read once, its parent and its start time together: the parent followed next is the
    # parent of the process whose start time was checked, not of one that took its pid after a later read.
    try:
        cur, below = parent_and_start(pid)
    except (FileNotFoundError, ProcessLookupError):
        return None
    for _ in range(max_depth):
        if cur <= 1:
            return None
        try:
            parent, started = parent_and_start(cur)
        except (FileNotFoundError, ProcessLookupError):
            return None   # it exited: its child is being reparented, so this walk says nothing
        if started > below:
            raise LarkError("the process tree changed while it was read: an ancestor's pid now names a "
                            "process younger than its child (pid reuse)", obj=f"pid {pid}, ancestor pid {cur}",
                            fix="none for the admin; a job must not outlive its starter")
        below = started
        try:
            exe = os.readlink(f"/proc/{cur}/exe")
            uid = real_uid(cur)
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            cur = parent
            continue
        if exe in wanted and uid == 0:
            argv = cmdline(cur)
            slot = slot_from_cmdline(argv)
            if not slot:
                raise LarkError("starter command line has no -a <slot>", obj=f"starter pid {cur}",
                                fix="check STARTER in the HTCondor configuration")
            if not alive(cur, started):
                raise LarkError("the starter exited while it was read (its pid may now name another process)",
                                obj=f"pid {pid}, starter pid {cur}", fix="none for the admin: the job is ending")
            found = StarterInfo(cur, started, slot, exe, argv)
            # HTCondor forks the starter to move files (DaemonCore's Create_Thread), and transfer plugins are
            # that fork's children: the job's starter is the fork's parent, the same program for the same slot.
            forked_from = _forked_from(found, wanted)
            return forked_from if forked_from is not None else found
        cur = parent
    return None


def _forked_from(child: StarterInfo, wanted: set[str]) -> StarterInfo | None:
    """The starter `child` was forked from (same program, root, same slot, started no later), else None."""
    try:
        pid = parent_of(child.pid)
        # Every job's setup asks this of its starter, whose parent is the startd: its exe settles it in one read.
        if pid <= 1 or os.readlink(f"/proc/{pid}/exe") not in wanted:
            return None
        started, uid, argv = start_time(pid), real_uid(pid), cmdline(pid)
        exe = os.readlink(f"/proc/{pid}/exe")   # after its start time: both are about this one process
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    if exe not in wanted or uid != 0 or started > child.start or slot_from_cmdline(argv) != child.slot:
        return None
    if not alive(pid, started):
        return None
    return StarterInfo(pid, started, child.slot, exe, argv)


def starter_of(peer: Peer, starter_paths: list[str]) -> StarterInfo | None:
    """The starter whose job `peer` is (None: not a job's process), for a request that acts on that job: the
    walk is about the peer only if the peer is still the process that connected, checked after it."""
    starter = find_starter(peer.pid, starter_paths)
    still_same_process(peer)
    return starter


def authorize_job(peer: Peer, starter_paths: list[str], daemon_netns: int,
                  daemon_userns: int | None = None) -> tuple[StarterInfo, int]:
    """Refuse anything that is not a job process in its own netns under a configured starter.

    The netns must be owned by larkd's own (the initial) user namespace: that is the one the starter made. A
    netns owned by another user namespace was made by the job (`unshare -Urn`), which then holds CAP_NET_ADMIN
    over it and could delete the limits and filters larkd puts inside.
    """
    try:
        job_ns, owner = netns_identity(peer.pid)
    except (FileNotFoundError, ProcessLookupError):
        raise LarkError("requesting process vanished", obj=f"pid {peer.pid}") from None
    if owner != (own_userns_inode() if daemon_userns is None else daemon_userns):
        raise LarkError("the request comes from a network namespace owned by a user namespace the job made "
                        "(e.g. unshare -Urn); the job would hold CAP_NET_ADMIN over its own limits",
                        obj=f"pid {peer.pid} uid {peer.uid} netns {job_ns}",
                        fix="run the job in the network namespace its starter gave it")
    if job_ns == daemon_netns:
        raise LarkError("request comes from the host's network namespace, not from a job's",
                        obj=f"pid {peer.pid} uid {peer.uid}",
                        fix="only job processes started with NO_JOB_NETWORKING may ask to be networked")
    starter = find_starter(peer.pid, starter_paths)
    if starter is None:
        raise LarkError("requesting process does not descend from a configured starter",
                        obj=f"pid {peer.pid} uid {peer.uid}", fix="check LARK_STARTER_PATHS")
    still_same_process(peer)  # after every /proc read about peer.pid: they were about the peer
    return starter, job_ns
