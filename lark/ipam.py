"""Crash-safe pools of addresses and ports, shared by concurrent setups (the CNI host-local scheme).

Each reserved item is a file named after it whose content is the owner's job key, created with O_EXCL so two
setups can never take the same item. The files live under run_dir (tmpfs), so a reboot empties the pool along
with the kernel objects it described. Owners are matched against job records to reclaim leaked items.
"""
from __future__ import annotations

import ipaddress
import logging
import os
import threading
from typing import Callable, Iterable, Iterator

from .errors import LarkError

log = logging.getLogger(__name__)


class LockPool:
    def __init__(self, directory: str, items: Callable[[], Iterator[str]], size: int, what: str):
        self.dir = directory
        self._items = items
        self.size = size
        self.what = what
        os.makedirs(self.dir, mode=0o700, exist_ok=True)

    def _path(self, item: str) -> str:
        return os.path.join(self.dir, item)

    def _hint(self) -> str | None:
        try:
            with open(self._path(".last")) as f:
                return f.read().strip()
        except OSError:
            return None

    def reserve(self, owner: str, job: str | None = None) -> str:
        existing = self.owned_by(owner)
        if existing:
            return existing[0]
        items = list(self._items())
        hint = self._hint()
        start = items.index(hint) + 1 if hint in items else 0
        for item in items[start:] + items[:start]:
            try:
                fd = os.open(self._path(item), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            except FileExistsError:
                continue
            with os.fdopen(fd, "w") as f:
                f.write(owner)
            tmp = self._path(f".last.tmp.{os.getpid()}.{threading.get_ident()}")
            with open(tmp, "w") as f:
                f.write(item)
            os.replace(tmp, self._path(".last"))
            return item
        raise LarkError(f"no free {self.what} left ({self.size} in the pool, all reserved)", job=job,
                        obj=f"pool {self.dir}", fix="run `lark gc` to reclaim leaked ones or enlarge the pool")

    def release(self, owner: str) -> list[str]:
        released = []
        for item, who in self.entries():
            if who == owner:
                try:
                    os.unlink(self._path(item))
                    released.append(item)
                except FileNotFoundError:
                    pass
        return released

    def owned_by(self, owner: str) -> list[str]:
        return [item for item, who in self.entries() if who == owner]

    def entries(self) -> Iterable[tuple[str, str]]:
        try:
            names = os.listdir(self.dir)
        except FileNotFoundError:
            return []
        out = []
        for name in names:
            if name.startswith(".") or ".tmp." in name:
                continue
            try:
                with open(self._path(name)) as f:
                    out.append((name, f.read().strip()))
            except FileNotFoundError:
                continue
        return out

    def drop(self, item: str) -> None:
        try:
            os.unlink(self._path(item))
        except FileNotFoundError:
            pass


def address_pool(ipam_dir: str, subnet: str) -> LockPool:
    net = ipaddress.IPv4Network(subnet)
    gateway = net.network_address + 1

    def items() -> Iterator[str]:
        for host in net.hosts():
            if host != gateway:
                yield str(host)

    size = max(net.num_addresses - 3, 0)
    return LockPool(os.path.join(ipam_dir, str(net).replace("/", "_")), items, size, "IPv4 addresses")


def port_pool(ipam_dir: str, lo: int, hi: int) -> LockPool:
    return LockPool(os.path.join(ipam_dir, f"ports_{lo}-{hi}"), lambda: (str(p) for p in range(lo, hi + 1)),
                    hi - lo + 1, "inbound ports")
