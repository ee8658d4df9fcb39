"""In-process nftables through libnftables (the library behind `nft`), with the `nft` binary as fallback.

Spawning `nft` costs a few milliseconds per job setup; the library call is the same JSON, same parser, same
kernel transaction. One context is shared under a lock (libnftables contexts are not thread-safe); its
netlink socket belongs to the netns larkd runs in, whatever namespace a setup thread is visiting.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import logging
import threading

log = logging.getLogger(__name__)
NFT_CTX_OUTPUT_JSON = 1 << 4


class LibNft:
    def __init__(self) -> None:
        name = ctypes.util.find_library("nftables") or "libnftables.so.1"
        lib = ctypes.CDLL(name)
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
        self.lib = lib
        self.ctx = lib.nft_ctx_new(0)
        if not self.ctx:
            raise OSError("nft_ctx_new failed")
        lib.nft_ctx_output_set_flags(self.ctx, NFT_CTX_OUTPUT_JSON)
        lib.nft_ctx_buffer_output(self.ctx)
        lib.nft_ctx_buffer_error(self.ctx)
        self.lock = threading.Lock()

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


def run_in_netns(ns_fd: int, cmd: str) -> tuple[int, str, str] | None:
    """Run `cmd` in another netns through a context made there (its socket stays in the netns it was made
    in), or None when libnftables is missing."""
    from ..netns import entered
    if get() is None:
        return None
    with entered(ns_fd):
        ctx = LibNft()
        try:
            return ctx.run(cmd)
        finally:
            ctx.close()


_instance: LibNft | None = None
_tried = False
_init_lock = threading.Lock()


def get() -> LibNft | None:
    global _instance, _tried
    with _init_lock:
        if not _tried:
            _tried = True
            try:
                _instance = LibNft()
            except OSError as e:
                log.info("libnftables unavailable (%s); using the nft binary", e)
    return _instance
