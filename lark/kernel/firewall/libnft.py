"""In-process nftables through libnftables (the library behind `nft`).

There is no fallback to the `nft` binary: it links libnftables itself, so where the library is missing the
binary is too.

Spawning `nft` costs a few milliseconds per job setup; the library call is the same JSON, same parser, same
kernel transaction. One context is shared; its netlink socket belongs to the netns larkd runs in, whatever
namespace a setup thread is visiting. Every call into the library, through any context, holds one process-wide
lock: libnftables keeps process-global state next to its contexts (the interface list it resolves device names
with, filled in the calling thread's netns and freed when any context is freed), so a context made in a job's
netns and freed by one setup thread while another resolved the uplink for a `fwd` failed that job with
"Interface does not exist" (seen with 17 bridged jobs starting at once, `bridge_isolate_jobs`).
"""
from __future__ import annotations

import ctypes
import ctypes.util
import functools
import threading

from ...errors import LarkError

NFT_CTX_OUTPUT_JSON = 1 << 4
_LIBRARY_LOCK = threading.RLock()   # every libnftables call, whatever the context (see above)


@functools.lru_cache(maxsize=1)
def _library() -> ctypes.CDLL:
    """libnftables, loaded and typed once per process: find_library runs `ldconfig -p` (about 4 ms), and
    run_in_netns makes a context per job netns, under the lock."""
    lib = ctypes.CDLL(ctypes.util.find_library("nftables") or "libnftables.so.1")
    lib.nft_ctx_new.restype = ctypes.c_void_p
    lib.nft_ctx_new.argtypes = [ctypes.c_uint32]
    lib.nft_ctx_output_set_flags.argtypes = [ctypes.c_void_p, ctypes.c_uint]
    lib.nft_ctx_buffer_output.argtypes = [ctypes.c_void_p]
    lib.nft_ctx_buffer_error.argtypes = [ctypes.c_void_p]
    lib.nft_ctx_get_output_buffer.argtypes = [ctypes.c_void_p]
    lib.nft_ctx_get_output_buffer.restype = ctypes.c_char_p
    lib.nft_ctx_get_error_buffer.argtypes = [ctypes.c_void_p]
    lib.nft_ctx_get_error_buffer.restype = ctypes.c_char_p
    lib.nft_run_cmd_from_buffer.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
    lib.nft_run_cmd_from_buffer.restype = ctypes.c_int
    lib.nft_ctx_free.argtypes = [ctypes.c_void_p]
    return lib


class LibNft:
    def __init__(self) -> None:
        lib = _library()
        self.lib = lib
        with _LIBRARY_LOCK:
            self.ctx = lib.nft_ctx_new(0)
        if not self.ctx:
            raise OSError("nft_ctx_new failed")
        lib.nft_ctx_output_set_flags(self.ctx, NFT_CTX_OUTPUT_JSON)
        lib.nft_ctx_buffer_output(self.ctx)
        lib.nft_ctx_buffer_error(self.ctx)
        self.lock = _LIBRARY_LOCK

    def run(self, cmd: str) -> tuple[int, str, str]:
        """Run one command or JSON batch; returns (rc, output, error) like the `nft` binary would."""
        with self.lock:
            rc = self.lib.nft_run_cmd_from_buffer(self.ctx, cmd.encode())
            out = self.lib.nft_ctx_get_output_buffer(self.ctx) or b""
            err = self.lib.nft_ctx_get_error_buffer(self.ctx) or b""
        return rc, out.decode(errors="replace"), err.decode(errors="replace")


    def close(self) -> None:
        with self.lock:
            if self.ctx:
                self.lib.nft_ctx_free(self.ctx)
                self.ctx = None


def run_in_netns(ns_fd: int, cmd: str) -> tuple[int, str, str]:
    """Run `cmd` in another netns through a context made there (its socket stays in the netns it was made in)."""
    from ..netns import entered
    get()  # a clear error when libnftables is missing, before entering anything
    with _LIBRARY_LOCK, entered(ns_fd):
        ctx = LibNft()
        try:
            return ctx.run(cmd)
        finally:
            ctx.close()


_instance: LibNft | None = None
_load_error: str | None = None
_init_lock = threading.Lock()


def get() -> LibNft:
    """The shared context, made on first use."""
    global _instance, _load_error
    with _init_lock:
        if _instance is None and _load_error is None:
            try:
                _instance = LibNft()
            except OSError as e:
                _load_error = str(e)
    if _instance is None:
        raise LarkError(f"libnftables cannot be loaded: {_load_error}", obj="nftables firewall backend",
                        fix="install libnftables1 (the nftables package), or set the firewall to iptables")
    return _instance
