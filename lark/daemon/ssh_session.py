"""condor_ssh_to_job sessions in the job's own network namespace (issue 22).

The starter runs the session's `sshd -i` through USER_JOB_WRAPPER, in a fresh empty network namespace of its own
(NO_JOB_NETWORKING applies to every process it starts). The wrapper, running as the job's user, cannot enter the
job's namespace (that takes CAP_SYS_ADMIN over it), so it asks larkd (`ssh_session`). larkd takes the wrapper's
standard descriptors (the session's connection, the sshd log) with pidfd_getfd(2), starts the same sshd in the
job's namespace as the wrapper's own uid and groups with no capabilities (nsenter, then setpriv), answers once it
runs and again when it ends, and ends it when the wrapper goes (the starter ends a session by killing it).

What this gives a job: it could already run any program as its user in its own namespace; larkd runs nothing as
another uid, with any capability, or in any other namespace, and it joins the asker's cgroups (the job's) before it
can start anything, so a job cannot use a session to run outside its limits. The starter does not track the
session's processes, so larkd ends the session's process group with the session, and when the job ends, every
process still in the job's namespace (what a session left running, e.g. `nohup`) is killed.
"""
from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import os
import shutil
import signal
import subprocess
from dataclasses import dataclass

from .. import protocol
from ..errors import LarkError
from . import peercred

log = logging.getLogger(__name__)

SYS_PIDFD_GETFD = 438           # the same number on every architecture (Linux >= 5.6)
SESSION_DIR = "/.condor_ssh_to_job_"
STANDARD_FDS = (0, 1, 2)
MAX_ENV_BYTES = 1 << 20
ROOT_ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}
# Run as the job's user after setpriv: read the session's environment (NUL-separated, as /proc/<pid>/environ)
# from the fd in argv[1], then become argv[2:] with it.
WITH_ENV_FROM_FD = (
    "import os, sys\n"
    "fd, data = int(sys.argv[1]), b''\n"
    "while chunk := os.read(fd, 65536):\n"
    "    data += chunk\n"
    "os.close(fd)\n"
    "env = dict(item.split(b'=', 1) for item in data.split(b'\\0') if b'=' in item)\n"
    "os.execve(sys.argv[2], sys.argv[2:], env)\n")

_libc = ctypes.CDLL(None, use_errno=True)


@dataclass(frozen=True)
class SessionCommand:
    """The sshd the starter asked for, checked: only its configuration file comes from the request."""
    config: str

    def program(self, sshd: str) -> list[str]:
        return [sshd, "-i", "-e", "-f", self.config]


def as_job_user(netns_path: str, uid: int, gid: int, env_fd: int, program: list[str]) -> list[str]:
    """The command line that runs `program` in the job's network namespace as the asker's user (with its groups),
    with the environment read from `env_fd`: for ssh sessions and transfer plugins alike."""
    nsenter, setpriv = shutil.which("nsenter"), shutil.which("setpriv")
    python = shutil.which("python3", path=ROOT_ENV["PATH"])   # the system's: every job user may run it
    if not nsenter or not setpriv or not python:
        raise LarkError("nsenter, setpriv or python3 not found", obj="util-linux, python3",
                        fix="install util-linux and python3 on the execution point")
    # nsenter (root) joins the job's network namespace only; setpriv becomes the wrapper's user with its
    # groups, keeps no capability (not even in the bounding set) and sets no_new_privs; the parent-death
    # signal ends the program with larkd (the wrapper has let go of it by then). Both run as root, so with
    # larkd's clean environment (ROOT_ENV): the asker's, which the job chose (LD_PRELOAD would run its code
    # in them as root), reaches only the program, from env_fd, once it is the job's user.
    return [nsenter, f"--net={netns_path}", "--", setpriv, f"--reuid={uid}", f"--regid={gid}", "--init-groups",
            "--inh-caps=-all", "--bounding-set=-all", "--no-new-privs", "--pdeathsig", "KILL", "--",
            python, "-I", "-S", "-c", WITH_ENV_FROM_FD, str(env_fd), *program]


def session_command(argv: object) -> SessionCommand:
    """The request's argv must be the starter's sshd for condor_ssh_to_job (`sshd -i -e -f
    <scratch>/.condor_ssh_to_job_N/sshd_config`); the program larkd runs is always this host's (`ssh_sshd`)."""
    if not (isinstance(argv, list) and len(argv) == 5 and all(isinstance(a, str) for a in argv)):
        raise LarkError("ssh_session needs the sshd command line the starter ran (5 strings)", obj="argv")
    prog, i, e, f, config = argv
    if os.path.basename(prog) != "sshd" or [i, e, f] != ["-i", "-e", "-f"]:
        raise LarkError("ssh_session runs only condor_ssh_to_job's sshd (sshd -i -e -f CONFIG)",
                        obj=f"argv {' '.join(argv)[:120]}")
    if not os.path.isabs(config) or SESSION_DIR not in config or "\0" in config or "/../" in config:
        raise LarkError("the sshd configuration must be the starter's, in the job's scratch directory "
                        f"(.../{SESSION_DIR.strip('/')}N/sshd_config)", obj=f"config {config[:120]}")
    return SessionCommand(config)


def take_fds(pidfd: int, fds: tuple[int, ...] = STANDARD_FDS) -> list[int]:
    """Duplicates of another process's descriptors (pidfd_getfd(2): root may, ptrace rules), close-on-exec."""
    taken: list[int] = []
    try:
        for fd in fds:
            new = _libc.syscall(SYS_PIDFD_GETFD, pidfd, fd, 0)
            if new < 0:
                err = ctypes.get_errno()
                raise LarkError(f"cannot take descriptor {fd} of the requesting process: {os.strerror(err)}",
                                obj="pidfd_getfd", fix="the wrapper must keep its standard descriptors open")
            taken.append(new)
    except BaseException:
        for fd in taken:
            os.close(fd)
        raise
    return taken


def environment_of(pid: int) -> dict[str, str]:
    """The environment the process was started with (the starter's for the session), as the sshd's."""
    with open(f"/proc/{pid}/environ", "rb") as f:
        raw = f.read(MAX_ENV_BYTES)
    env: dict[str, str] = {}
    for item in raw.split(b"\0"):
        name, sep, value = item.partition(b"=")
        if sep and name:
            env[name.decode(errors="replace")] = value.decode(errors="replace")
    return env


def processes_in_netns(netns_inode: int) -> list[int]:
    """Every process whose network namespace is this one (/proc/<pid>/ns/net)."""
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            if os.stat(f"/proc/{entry.name}/ns/net").st_ino == netns_inode:
                found.append(int(entry.name))
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue
    return found


def kill_leftovers(netns_inode: int) -> list[int]:
    """SIGKILL what is still in a finished job's namespace after ssh sessions ran there; the pids it signalled."""
    killed = []
    for pid in processes_in_netns(netns_inode):
        if pid == os.getpid():
            continue
        try:
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)
        except ProcessLookupError:
            pass
    return killed


def environment_fd(env: dict[str, str]) -> int:
    """An in-memory file holding `env` (NUL-separated), at offset 0, for WITH_ENV_FROM_FD."""
    fd = os.memfd_create("lark-ssh-session-env", os.MFD_CLOEXEC)
    data = b"".join(f"{k}={v}".encode() + b"\0" for k, v in env.items())
    os.write(fd, data)
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


def _cgroup_mounts() -> list[tuple[str, str, set[str]]]:
    """(the cgroup at its root, mount point, its controllers) for every cgroup hierarchy larkd sees; cgroup2's
    controllers are {""}."""
    found = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            fields = line.split()
            sep = fields.index("-")
            fstype, superopts = fields[sep + 1], fields[sep + 3]
            if fstype == "cgroup2":
                found.append((fields[3], fields[4], {""}))
            elif fstype == "cgroup":
                found.append((fields[3], fields[4], set(superopts.split(","))))
    return found


def _cgroups_of(pid: int) -> dict[str, str]:
    """Hierarchy (its controllers as /proc/<pid>/cgroup names them; "" for cgroup2) -> the process's path there."""
    groups = {}
    with open(f"/proc/{pid}/cgroup") as f:
        for line in f:
            _, controllers, path = line.rstrip("\n").split(":", 2)
            groups[controllers] = path
    return groups


def cgroup_join_plan(asker: int) -> tuple[str, ...]:
    """The cgroup.procs files that put a child of larkd in every cgroup the asker is in (the job's, which HTCondor
    limits and kills at the job's end), for the hierarchies where larkd's own differ. Raises when one cannot be
    reached from larkd's mounts."""
    mounts = _cgroup_mounts()
    own = _cgroups_of(os.getpid())      # what larkd's children start in
    files = []
    for controllers, path in _cgroups_of(asker).items():
        if own.get(controllers) == path:
            continue
        wanted = set(controllers.split(",")) if controllers else {""}
        mount = next(((root, mp) for root, mp, opts in mounts if wanted <= opts
                      and (root == "/" or path == root or path.startswith(root + "/"))), None)
        if mount is None:
            raise LarkError(f"cannot put the ssh session in the job's cgroup ({controllers or 'cgroup2'}:{path}): "
                            f"no mount of that hierarchy shows it", obj=f"pid {asker}",
                            fix="mount the cgroup hierarchies where larkd runs; the session then runs without "
                                "the job's network")
        below = path[len(mount[0]):] if mount[0] != "/" else path
        files.append(os.path.join(mount[1], below.lstrip("/"), "cgroup.procs"))
    return tuple(files)


class CgroupJoin:
    """Popen's preexec_fn: the forked session process moves itself into the job's cgroups before its first exec,
    so nothing of the session ever runs in larkd's (moved by larkd after the start, its first steps and what they
    fork would). Only system calls in the child; a failure there makes Popen raise and nothing is run."""

    def __init__(self, files: tuple[str, ...]):
        self.files = files

    def __call__(self) -> None:
        for path in self.files:
            fd = os.open(path, os.O_WRONLY)
            try:
                os.write(fd, b"0")      # "0": the writing process itself, in cgroup v1 and v2
            finally:
                os.close(fd)


async def run_as_asker(who: peercred.Peer, job_id: str, netns_path: str, program: list[str],
                        what: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> int | None:
    """Run `program` in the job's namespace at `netns_path` as the asker (this module says how and why),
    with the asker's standard descriptors, environment, working directory and cgroups. Answers `started`
    once it runs (the asker then lets go of its descriptors); returns its exit code. It ends when the asker
    goes (closes the connection or dies)."""
    pidfd = who.pidfd if who.pidfd is not None else os.pidfd_open(who.pid)
    try:
        peercred.still_same_process(who)   # the pidfd (or pid) is the requester's, not a reused pid's
        fds = take_fds(pidfd)
        env, cwd = environment_of(who.pid), os.readlink(f"/proc/{who.pid}/cwd")
    finally:
        if pidfd != who.pidfd:
            os.close(pidfd)
    env_fd = environment_fd(env)
    try:
        join = CgroupJoin(cgroup_join_plan(who.pid))
        proc = await asyncio.create_subprocess_exec(
            *as_job_user(netns_path, who.uid, who.gid, env_fd, program), stdin=fds[0],
            stdout=fds[1], stderr=fds[2], env=ROOT_ENV, cwd=cwd, start_new_session=True,
            pass_fds=(env_fd,), preexec_fn=join)
    except subprocess.SubprocessError as e:
        raise LarkError(f"cannot put the {what} in the job's cgroups {list(join.files)}: {e}",
                        job=job_id, obj=f"pid {who.pid}",
                        fix="mount the cgroup hierarchies read-write where larkd runs") from None
    finally:
        for fd in (*fds, env_fd):
            os.close(fd)
    log.info("%s of job %s: pid %d (%s) in its network namespace", what, job_id, proc.pid,
             os.path.basename(program[0]))
    writer.write(protocol.ok(started=True, pid=proc.pid))
    await writer.drain()
    ended = asyncio.ensure_future(proc.wait())
    gone = asyncio.ensure_future(reader.read())   # b"" once the wrapper closed or died
    await asyncio.wait({ended, gone}, return_when=asyncio.FIRST_COMPLETED)
    gone.cancel()
    if not ended.done():    # the starter killed the wrapper: the program (its process group) is over
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            await asyncio.wait_for(asyncio.shield(ended), 5)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            await ended
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)     # what the program left in its group
    return proc.returncode
