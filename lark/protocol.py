"""The larkd wire protocol: one JSON object per line, one request and one answer per connection (ssh_session:
two answers).

Every job's wrapper speaks it before its job can start, so this module uses the standard library's C JSON codec
(`_json`, what the `json` package itself runs) directly: importing `json` pulls in `re` and `enum`, ~10 ms of
each job's start (issue 15). Where `_json` is missing (not CPython), `json` does the same job.
"""
from __future__ import annotations

from . import PROTOCOL_VERSION
from .errors import LarkError

try:
    import _json
    HAVE_C_JSON = True
except ImportError:  # pragma: no cover - CPython always has it
    HAVE_C_JSON = False


def _unencodable(obj: object) -> object:
    raise TypeError(f"Object of type {type(obj).__name__} is not JSON serializable")


def _constant(name: str) -> float:
    return {"NaN": float("nan"), "Infinity": float("inf"), "-Infinity": float("-inf")}[name]


class _ScanContext:
    """What `_json.make_scanner` reads from a JSONDecoder: json.loads's defaults."""
    strict = True
    object_hook = None
    object_pairs_hook = None
    parse_float = float
    parse_int = int
    parse_constant = staticmethod(_constant)


def dumps(obj: object) -> str:
    """json.dumps(obj, separators=(",", ":")), byte for byte."""
    if not HAVE_C_JSON:
        import json
        return json.dumps(obj, separators=(",", ":"))
    encode = _json.make_encoder({}, _unencodable, _json.encode_basestring_ascii, None, ":", ",", False, False, True)
    return "".join(encode(obj, 0))


def loads(data: bytes | str) -> object:
    """json.loads for one document (UTF-8 bytes or text); ValueError when it is not JSON."""
    if not HAVE_C_JSON:
        import json
        return json.loads(data)
    text = data.decode() if isinstance(data, (bytes, bytearray)) else data
    text = text.strip(" \t\n\r")
    try:
        # typeshed annotates the argument as a make_scanner; the C code only reads the attributes it names.
        obj, end = _json.make_scanner(_ScanContext)(text, 0)  # type: ignore[arg-type]
    except StopIteration:
        raise ValueError("not a JSON document") from None
    if end != len(text):
        raise ValueError("extra data after the JSON document")
    return obj

# ssh_session and transfer_plugin answer twice on their connection (started, then the exit code): daemon/ssh_session.py.
OPS = {"ping", "check", "setup", "release", "stats", "push", "status", "gc", "totals", "verify", "ssh_session",
       "transfer_plugin", "docker_setup", "sandbox_limit"}


def encode(msg: dict) -> bytes:
    return (dumps(msg) + "\n").encode()


def request(op: str, **fields) -> bytes:
    return encode({"lark": PROTOCOL_VERSION, "op": op, **fields})


def parse_request(line: bytes) -> dict:
    try:
        msg = loads(line)
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
