"""Talking to larkd over its Unix socket.

Every job's wrapper runs this before its job starts, so it imports only what costs nothing: the C modules under
`socket` and `struct` (the `socket` module imports `enum` and `selectors`, several ms of every job's start) and
the protocol's C JSON codec. `random` is imported only when a retry needs it.
"""
from __future__ import annotations

import _socket
import _struct
import os
import time

from .. import protocol
from ..errors import DaemonBusy, DaemonUnreachable, LarkError

DEFAULT_SOCKET = "/run/lark/lark.sock"
CONFIG_FILE = "/etc/lark/lark.toml"  # lark.config.DEFAULT_PATH (a unit test keeps the two equal)
START_LARKD = "start larkd: condor_on -daemon LARKD, or systemctl start larkd"


def socket_path(explicit: str | None = None) -> str:
    if explicit:
        return explicit
    if os.environ.get("LARK_SOCKET"):
        return os.environ["LARK_SOCKET"]
    # Not HTCondor's configuration: importing its bindings would cost every job start ~0.1 s. A socket moved
    # with LARK_SOCKET reaches the job's side through $LARK_SOCKET (docs/admin.md).
    path = os.environ.get("LARK_CONFIG") or CONFIG_FILE
    if not os.path.exists(path):
        return DEFAULT_SOCKET  # no file can move it: skip importing a TOML parser (tens of ms)
    # The deprecated TOML file (lark.config reads it for larkd): tables of keys, `socket` in [daemon]. Read with
    # the standard library's parser, so the job's side never imports the configuration code.
    import tomllib
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except (OSError, ValueError):
        return DEFAULT_SOCKET
    for table in data.values():
        if isinstance(table, dict) and isinstance(table.get("socket"), str):
            return table["socket"]
    return DEFAULT_SOCKET


def call(op: str, *, path: str | None = None, timeout: float = 30.0, **fields) -> dict:
    path = socket_path(path)
    s = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    # A blocking connect waits in the kernel's queue while larkd's listen backlog is full (a non-blocking one,
    # which settimeout would make, fails at once with EAGAIN); SO_SNDTIMEO bounds that wait.
    s.setsockopt(_socket.SOL_SOCKET, _socket.SO_SNDTIMEO, _struct.pack("ll", int(timeout), int(timeout % 1 * 1e6)))
    try:
        try:
            s.connect(path)
            s.settimeout(timeout)
        except FileNotFoundError:
            raise DaemonUnreachable("larkd is not running (no socket)", obj=path,
                            fix=START_LARKD) from None
        except ConnectionRefusedError:
            raise DaemonUnreachable("larkd is not running (connection refused)", obj=path, fix=START_LARKD) from None
        except PermissionError:
            raise LarkError("permission denied on the larkd socket", obj=path) from None
        except BlockingIOError:
            raise DaemonBusy("larkd's connection queue stayed full", obj=path, fix="retry in a moment") from None
        try:
            s.sendall(protocol.request(op, **fields))
        except (BrokenPipeError, ConnectionResetError):
            pass  # larkd may answer (busy) and close before reading the request: its answer is still to be read
        buf = b""
        while not buf.endswith(b"\n"):
            chunk = s.recv(65536)
            if not chunk:
                break
            buf += chunk
    except TimeoutError:  # what socket.timeout is
        raise LarkError(f"larkd did not answer within {timeout:g} s", obj=path, fix="check larkd's log") from None
    except OSError as e:
        raise DaemonUnreachable(f"connection to larkd lost ({e.strerror or e})", obj=path,
                        fix="larkd may have died; check its log and restart it") from None
    finally:
        s.close()
    if not buf:
        raise DaemonUnreachable("larkd closed the connection without answering", obj=path, fix="check larkd's log")
    try:
        answer = protocol.loads(buf)
    except ValueError:
        raise LarkError("larkd sent an unreadable answer", obj=path) from None
    if not isinstance(answer, dict):
        raise LarkError(f"larkd answered with a JSON {type(answer).__name__}, not an object", obj=path,
                        fix="larkd and the wrapper are from different versions: install the same Lark on both")
    if not answer.get("ok"):
        if answer.get("busy"):
            raise DaemonBusy(answer.get("error", "busy"), obj="larkd", fix="retry in a moment")
        refused = LarkError(answer.get("error", "unknown error"), obj="larkd")
        refused.held = answer.get("held") is True  # larkd put the job on hold at its schedd
        raise refused
    return answer


def call_patiently(op: str, *, wait: float, timeout: float = 30.0, **fields) -> dict:
    """`call`, retrying for up to `wait` seconds while larkd is unreachable (condor_master restarts it) or busy
    (another party holds many connections). Pauses double, with jitter so that waiting clients spread out."""
    deadline = time.monotonic() + wait
    delay = 0.2
    while True:
        try:
            return call(op, timeout=timeout, **fields)
        except DaemonUnreachable:
            import random  # only when larkd is away: not on every job's start
            pause = delay * random.uniform(0.5, 1.5)
            if time.monotonic() + pause > deadline:
                raise
            time.sleep(pause)
            delay = min(delay * 2, 2.0)
