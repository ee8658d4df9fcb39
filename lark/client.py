"""Talking to larkd over its Unix socket."""
from __future__ import annotations

import json
import os
import socket

from . import protocol
from .errors import LarkError

DEFAULT_SOCKET = "/run/lark/lark.sock"


def socket_path(explicit: str | None = None) -> str:
    if explicit:
        return explicit
    if os.environ.get("LARK_SOCKET"):
        return os.environ["LARK_SOCKET"]
    try:
        from .config import load
        return load().socket
    except LarkError:
        return DEFAULT_SOCKET


def call(op: str, *, path: str | None = None, timeout: float = 30.0, **fields) -> dict:
    path = socket_path(path)
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(timeout)
    try:
        try:
            s.connect(path)
        except FileNotFoundError:
            raise LarkError("larkd is not running (no socket)", obj=path,
                            fix="start larkd (condor_master DAEMON_LIST or systemd)") from None
        except ConnectionRefusedError:
            raise LarkError("larkd is not running (connection refused)", obj=path, fix="start larkd") from None
        except PermissionError:
            raise LarkError("permission denied on the larkd socket", obj=path) from None
        s.sendall(protocol.request(op, **fields))
        buf = b""
        while not buf.endswith(b"\n"):
            chunk = s.recv(65536)
            if not chunk:
                break
            buf += chunk
    except socket.timeout:
        raise LarkError(f"larkd did not answer within {timeout:g} s", obj=path, fix="check larkd's log") from None
    except OSError as e:
        raise LarkError(f"connection to larkd lost ({e.strerror or e})", obj=path,
                        fix="larkd may have died; check its log and restart it") from None
    finally:
        s.close()
    if not buf:
        raise LarkError("larkd closed the connection without answering", obj=path, fix="check larkd's log")
    try:
        answer = json.loads(buf)
    except ValueError:
        raise LarkError("larkd sent an unreadable answer", obj=path) from None
    if not answer.get("ok"):
        raise LarkError(answer.get("error", "unknown error"), obj="larkd")
    return answer
