"""Heap pages freed by a burst of job setups and teardowns, given back to the kernel once larkd goes quiet.

A setup's transient buffers (netlink replies, nft JSON, encoded requests) are freed to glibc's malloc, which keeps
the pages for reuse; after 128 setups larkd's RSS held ~4 MB of them (measured: malloc_trim(0) took it from 91.1
to 87.3 MB in 0.85 ms, bench/scale128.py; issue 27's larkd RSS goal). One trim per burst, from the poller, when
a whole poll interval passed without a setup or teardown: the cost is paid once per burst, at most once per poll
interval whatever jobs do (a setup that arrives during the ~1 ms trim takes another worker, or waits that long).
Where the C library has no malloc_trim (not glibc) nothing is done.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import logging
from collections.abc import Callable

log = logging.getLogger(__name__)


def glibc_malloc_trim() -> Callable[[], None] | None:
    """libc's malloc_trim(0), or None where the C library has none."""
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name) if name else ctypes.CDLL(None)
        trim = libc.malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int

    def trim_heap() -> None:
        trim(0)   # returns 1 when memory was released; either way nothing to do
    return trim_heap


class HeapTrim:
    """Counts larkd's network changes (setups, teardowns) and trims once after each burst of them."""

    def __init__(self, trim: Callable[[], None] | None = None):
        self.trim = trim if trim is not None else glibc_malloc_trim()
        self.changes = 0          # setups and teardowns so far
        self._at_last_poll = 0    # self.changes at the previous poll
        self._trimmed_at = 0      # self.changes at the last trim

    def changed(self) -> None:
        self.changes += 1

    def due(self) -> bool:
        """Called once per poll: a trim is due when there were changes since the last trim and none since the
        previous poll (the burst is over)."""
        quiet = self.changes == self._at_last_poll
        self._at_last_poll = self.changes
        return quiet and self.changes != self._trimmed_at and self.trim is not None

    def run(self) -> None:
        self._trimmed_at = self._at_last_poll
        if self.trim is not None:
            self.trim()
