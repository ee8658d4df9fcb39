"""The larkd wire protocol: one JSON object per line, one request and one answer per connection."""
from __future__ import annotations

import json

from . import PROTOCOL_VERSION
from .errors import LarkError

OPS = {"ping", "check", "setup", "release", "stats", "status", "gc"}


def encode(msg: dict) -> bytes:
    return (json.dumps(msg, separators=(",", ":")) + "\n").encode()


def request(op: str, **fields) -> bytes:
    return encode({"lark": PROTOCOL_VERSION, "op": op, **fields})


def parse_request(line: bytes) -> dict:
    try:
        msg = json.loads(line)
    except (ValueError, UnicodeDecodeError):
        raise LarkError("request is not JSON", obj="protocol", fix="speak lark protocol v1") from None
    except RecursionError:  # e.g. 60,000 nested brackets in one line: an error, not a traceback in the log
        raise LarkError("request nests too deeply", obj="protocol", fix="speak lark protocol v1") from None
    if not isinstance(msg, dict):
        raise LarkError("request is not a JSON object", obj="protocol")
    if msg.get("lark") != PROTOCOL_VERSION:
        raise LarkError(f"unsupported protocol version {msg.get('lark')!r}; this larkd speaks {PROTOCOL_VERSION}",
                        obj="protocol", fix="upgrade lark on this machine so client and daemon match")
    if msg.get("op") not in OPS:
        raise LarkError(f"unknown operation {str(msg.get('op'))[:40]!r}", obj="protocol")
    return msg


def ok(**fields) -> bytes:
    return encode({"lark": PROTOCOL_VERSION, "ok": True, **fields})


def error(message: str, **fields) -> bytes:
    return encode({"lark": PROTOCOL_VERSION, "ok": False, "error": message, **fields})
