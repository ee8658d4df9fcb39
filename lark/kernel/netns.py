"""Network-namespace helpers (the one place that calls setns/mount), in the spirit of CNI's ns package."""
from __future__ import annotations

import contextlib
import ctypes
import errno
import os
from collections.abc import Iterator
from typing import Any, cast

from pyroute2 import IPRoute

from ..errors import LarkError
from . import rtnl
from .drift import Finding, drifted, present

CLONE_NEWNET = 0x40000000
MS_BIND = 4096
MS_REC = 16384
MS_SHARED = 1 << 20
MNT_DETACH = 2

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_void_p]
_libc.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]


MAX_NET_NAMESPACES = "/proc/sys/user/max_net_namespaces"


def net_namespace_limit(path: str | None = None) -> int | None:
    """How many network namespaces this user namespace's users (root included) may hold at once; None if unknown.
    Hardening guides set `user.max_net_namespaces = 0` on worker nodes; then unshare(CLONE_NEWNET) fails with
    ENOSPC for root too, so HTCondor's starter cannot give any job its namespace (NO_JOB_NETWORKING)."""
    try:
        with open(path or MAX_NET_NAMESPACES) as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return None


def net_namespaces_forbidden(path: str | None = None) -> LarkError | None:
    """The refusal to give when no job can get a network namespace here, else None."""
    if net_namespace_limit(path) != 0:
        return None
    return LarkError("this execution point allows no network namespaces, so HTCondor cannot start any job in one "
                     "(NO_JOB_NETWORKING)", obj="sysctl user.max_net_namespaces = 0",
                     fix="set user.max_net_namespaces above the number of slots (to stop unprivileged user "
                         "namespaces, set user.max_user_namespaces = 0 instead: Lark and HTCondor do not need them)")


def _check(ret: int, what: str) -> None:
    if ret != 0:
        e = ctypes.get_errno()
        raise OSError(e, f"{what}: {os.strerror(e)}")


def setns(fd: int) -> None:
    _check(_libc.setns(fd, CLONE_NEWNET), "setns")


def netns_inode_of_pid(pid: int) -> int:
    return os.stat(f"/proc/{pid}/ns/net").st_ino


def own_netns_inode() -> int:
    return os.stat("/proc/thread-self/ns/net").st_ino


def ensure_netns_dir(path: str) -> None:
    """Make the directory a shared mount, as `ip netns add` does, so later mount namespaces see our names."""
    os.makedirs(path, mode=0o755, exist_ok=True)
    p = path.encode()
    if _libc.mount(b"none", p, None, MS_SHARED | MS_REC, None) == 0:
        return
    if ctypes.get_errno() != errno.EINVAL:
        return
    _check(_libc.mount(p, p, b"none", MS_BIND | MS_REC, None), f"bind-mount {path} on itself")
    _check(_libc.mount(b"none", p, None, MS_SHARED | MS_REC, None), f"make {path} shared")


def attach(pid: int, path: str, expect_inode: int | None = None) -> None:
    """Name the netns of `pid` by bind-mounting it at `path` (what `ip netns attach` does).

    `expect_inode`: the namespace that was authorised. A pid is only a name: if the job exited after its request
    was checked, the pid may now be another process in another namespace, so the named one is checked after the
    mount (the mount pins it) and never kept when it differs."""
    if is_mounted_netns(path):
        if os.stat(path).st_ino == netns_inode_of_pid(pid) and expect_inode in (None, os.stat(path).st_ino):
            return
        raise OSError(errno.EEXIST, f"{path} already names another namespace")
    fd = os.open(path, os.O_RDONLY | os.O_CREAT, 0o444)
    os.close(fd)
    _check(_libc.mount(f"/proc/{pid}/ns/net".encode(), path.encode(), b"none", MS_BIND, None),
           f"bind-mount netns of pid {pid} at {path}")
    if expect_inode is not None and os.stat(path).st_ino != expect_inode:
        detach(path)
        raise OSError(errno.ESRCH, f"pid {pid} is no longer in the network namespace that was authorised "
                                   "(the job's wrapper must wait for larkd's answer)")


def create(path: str) -> int:
    """A new, empty network namespace named at `path` (what `ip netns add` does); its inode. For a job's file
    transfers before the job has a namespace of its own. Only this thread moves, and it moves back."""
    if is_mounted_netns(path):
        raise OSError(errno.EEXIST, f"{path} already names a namespace")
    fd = os.open(path, os.O_RDONLY | os.O_CREAT, 0o444)
    os.close(fd)
    home = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    try:
        _check(_libc.unshare(CLONE_NEWNET), "unshare a network namespace")
        try:
            _check(_libc.mount(b"/proc/thread-self/ns/net", path.encode(), b"none", MS_BIND, None),
                   f"bind-mount a new netns at {path}")
        finally:
            setns(home)
    finally:
        os.close(home)
    return os.stat(path).st_ino


def verify_named(path: str, inode: int) -> Finding:
    """The job's namespace is still named at `path` (attach's bind mount) and is the one that was authorised."""
    obj = f"netns {os.path.basename(path)}"
    if not is_mounted_netns(path):
        return drifted(obj, f"{path} no longer names the job's namespace (unmounted or removed)",
                       "something other than larkd ran `ip netns del` or umount on it")
    if os.stat(path).st_ino != inode:
        return drifted(obj, f"{path} names namespace {os.stat(path).st_ino}, not the job's {inode}",
                       "something other than larkd mounted another namespace on the job's name")
    return present(obj)


def is_mounted_netns(path: str) -> bool:
    try:
        return os.stat(path).st_dev != os.stat(os.path.dirname(path)).st_dev
    except FileNotFoundError:
        return False


def detach(path: str) -> bool:
    """Unmount and remove a netns name; safe to repeat. Returns whether anything was there."""
    found = False
    while is_mounted_netns(path):
        found = True
        if _libc.umount2(path.encode(), MNT_DETACH) != 0:
            e = ctypes.get_errno()
            if e in (errno.EINVAL, errno.ENOENT):
                break
            raise OSError(e, f"umount {path}: {os.strerror(e)}")
    try:
        os.unlink(path)
        found = True
    except FileNotFoundError:
        pass
    return found


def list_named(netns_dir: str, prefix: str) -> list[str]:
    try:
        return sorted(n for n in os.listdir(netns_dir) if n.startswith(prefix))
    except FileNotFoundError:
        return []


@contextlib.contextmanager
def entered(ns_fd: int) -> Iterator[None]:
    """Run the block with this thread in another netns; always return, even on error."""
    home = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    try:
        setns(ns_fd)
        try:
            yield
        finally:
            setns(home)
    finally:
        os.close(home)


class JobNetlink:
    """Netlink in another netns: `rtnl`, a raw socket for the setup's fixed requests (links.py uses it), and a
    pyroute2 IPRoute there, made on the first use of any IPRoute method or attribute (making and closing one costs
    ~0.5 ms, more than everything a NAT job's setup asks in its netns through `rtnl`)."""

    def __init__(self, ns_fd: int) -> None:
        self.ns_inode = os.fstat(ns_fd).st_ino  # which netns (links.py matches the veth it made there)
        self._ns_fd = os.dup(ns_fd)  # the caller may close its descriptor before the IPRoute is made
        try:
            with entered(ns_fd):
                self.rtnl = rtnl.Rtnl()
        except BaseException:
            os.close(self._ns_fd)
            raise
        self._ipr: IPRoute | None = None

    def __getattr__(self, name: str) -> Any:  # only for names this class does not have: IPRoute's
        if name.startswith("_"):
            raise AttributeError(name)
        if self._ipr is None:
            if self._ns_fd < 0:
                raise ValueError("netlink in the job's netns is closed")
            with entered(self._ns_fd):
                self._ipr = IPRoute()
        return getattr(self._ipr, name)

    def close(self) -> None:
        self.rtnl.close()
        if self._ipr is not None:
            self._ipr.close()
            self._ipr = None
        if self._ns_fd >= 0:
            os.close(self._ns_fd)
            self._ns_fd = -1

    def __enter__(self) -> JobNetlink:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def netlink_in(ns_fd: int) -> IPRoute:
    """Netlink bound to another netns, opened in-process (a helper process per namespace costs ~13 ms): a
    JobNetlink, used as the IPRoute it makes on demand."""
    return cast(IPRoute, JobNetlink(ns_fd))


def write_sysctl_in(ns_fd: int, key: str, value: str) -> None:
    # /proc/sys/net follows the netns of the thread that opens the file.
    with entered(ns_fd), open("/proc/sys/" + key.replace(".", "/"), "w") as f:
        f.write(value)
