"""The job attributes a report reads, and how one job ad becomes one cache row."""
from __future__ import annotations

import json
import math
from typing import Any, Mapping

# Attributes read from every history ad (the projection sent to the schedds). Network* and Lark* are written
# by larkd (lark/daemon/adpush.py); the rest are HTCondor's own.
CORE_ATTRS = [
    "GlobalJobId", "Owner", "AcctGroup", "AccountingGroup", "LastRemoteHost", "RemoteHost", "CompletionDate",
    "EnteredCurrentStatus", "JobCurrentStartDate", "RemoteWallClockTime", "RequestBandwidth",
    "LarkNetworkType", "LarkBandwidthLimit",
    "NetworkIncomingBytes", "NetworkOutgoingBytes", "NetworkIncomingPackets", "NetworkOutgoingPackets",
    "NetworkIncomingAvgRate", "NetworkOutgoingAvgRate", "NetworkIncomingPeakRate", "NetworkOutgoingPeakRate",
]
# Job attributes kept besides the core ones, so `--by` can group by them later (`--attr` adds more at import).
DEFAULT_EXTRA_ATTRS = ["JobBatchName", "ProjectName", "x509UserProxyVOName", "JobUniverse", "JobStatus"]


def extra_attributes(more: list[str] | None) -> list[str]:
    """The job attributes kept for grouping: the defaults and `--attr` ones, each once whatever its case
    (extra_key form, sorted)."""
    return sorted({extra_key(a) for a in [*DEFAULT_EXTRA_ATTRS, *(more or [])] if a.strip()})


# A job "hit its limit" when its peak rate in either direction reached this share of the limit: the shaper
# holds IP throughput at 0.95-0.96 of the configured rate (TCP/IP headers, docs/design.md), and the peak is a
# poll-interval average, so a saturated job reads a little under the limit.
HIT_LIMIT_SHARE = 0.9

COLUMNS = ["gid", "source", "owner", "acct_group", "ep", "network_type", "completed", "wall_s", "bytes_in",
           "bytes_out", "packets_in", "packets_out", "avg_in_bps", "avg_out_bps", "peak_in_bps", "peak_out_bps",
           "limit_mbit", "request_mbit", "extra"]


class Row(tuple):
    """One cache row: the values of COLUMNS, in order (a tuple: a million of them are built per import)."""
    __slots__ = ()

    @property
    def values(self) -> tuple:
        return self

    @property
    def gid(self) -> str:
        return self[0]


def extra_key(name: str) -> str:
    """How a kept attribute is stored and found: ClassAd names are case-insensitive, so `--by projectname`,
    `--attr PROJECTNAME` and an ad's `ProjectName` are one attribute."""
    return name.strip().lower()


_NUMERIC_START = frozenset("-0123456789.")


def decode_literal(text: str) -> Any:
    """The value of the right-hand side of an old-syntax ClassAd line (as history files hold them).

    Integers, reals and strings without escapes (nearly every value in a history file) are decoded here,
    because the ClassAd parser for each of millions of values is what would make a large import slow;
    anything else (escaped strings, booleans, expressions, lists) goes to classad2.
    """
    if text[:1] == '"':
        if text[-1:] == '"' and "\\" not in text and text.count('"') == 2:
            return text[1:-1]
    elif text and text[0] in _NUMERIC_START:
        try:
            return int(text)
        except ValueError:
            try:
                return float(text)
            except ValueError:
                pass
    import classad2
    try:   # history files are in the old syntax, where only \" is an escape
        value = classad2.parseOne(f"X = {text}", classad2.ParserType.Old).eval("X")
    except Exception:
        return text
    return None if isinstance(value, classad2.Value) else value   # Undefined / Error


def _num(v: Any, cast=float) -> Any:
    if v is None or isinstance(v, bool):
        return None
    try:
        return cast(v)
    except (TypeError, ValueError):
        return None


def _int0(v: Any) -> int:
    return v if type(v) is int else _num(v, int) or 0


def _float0(v: Any) -> float:
    if type(v) in (float, int):
        return float(v)
    return _num(v) or 0.0


def _text(v: Any) -> str:
    return "" if v is None else v if type(v) is str else str(v)


def ep_of(remote_host: str) -> str:
    """`slot1_2@ep01.example.org` -> `ep01.example.org` (the EP, not the slot: bounded, and what admins mean)."""
    return remote_host.rpartition("@")[2] if remote_host else ""


# One encoder for what is not a plain string or number (json.dumps with options builds an encoder per call).
_encode_other = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, default=str).encode
_encode_str = json.encoder.encode_basestring   # the C one when available


def _json_value(v: Any) -> str:
    t = type(v)
    if t is str:
        return _encode_str(v)
    if t is int or t is float and math.isfinite(v):
        return repr(v)
    return _encode_other(v)


def extra_json(kept: list[tuple[str, Any]]) -> str | None:
    """The kept attributes as the JSON object stored in `extra` ((extra_key, value) pairs, sorted, no None):
    built here rather than by json.dumps, which costs a new encoder per call."""
    if not kept:
        return None
    return "{" + ",".join(f'"{k}":{_json_value(v)}' for k, v in kept) + "}"


def row_from_ad(ad: Mapping[str, Any], source: str, extra_attrs: list[str]) -> Row | None:
    """One cache row from a job ad as plain values (sources.ad_values of a classad2.ClassAd, whose names keep
    the ad's spelling: found here in any case). None for ads Lark never networked (no Network* figures) or
    without GlobalJobId."""
    get = {k.lower(): v for k, v in ad.items()}.get
    gid = _text(get("globaljobid"))
    b_in, b_out = get("networkincomingbytes"), get("networkoutgoingbytes")
    if not gid or b_in is None and b_out is None:
        return None
    kept = [(a, v) for a in sorted({extra_key(a) for a in extra_attrs}) if (v := get(a)) is not None]
    return Row((
        gid, source, _text(get("owner")), _text(get("acctgroup")) or _text(get("accountinggroup")),
        ep_of(_text(get("lastremotehost")) or _text(get("remotehost"))),
        _text(get("larknetworktype")), _int0(get("completiondate")) or _int0(get("enteredcurrentstatus")),
        _num(get("remotewallclocktime")),
        _int0(b_in), _int0(b_out), _int0(get("networkincomingpackets")), _int0(get("networkoutgoingpackets")),
        _float0(get("networkincomingavgrate")), _float0(get("networkoutgoingavgrate")),
        _float0(get("networkincomingpeakrate")), _float0(get("networkoutgoingpeakrate")),
        _num(get("larkbandwidthlimit")), _num(get("requestbandwidth")), extra_json(kept),
    ))


# -- the history-file fast path: literal text as bytes, straight from the file ---------------------------------
# Slots of CORE_ATTRS in the list sources.AttrMatcher fills (the kept attributes follow them).
(_GID, _OWNER, _ACCT, _ACCTING, _LRH, _RH, _DONE, _ECS, _START, _WALL, _REQ, _TYPE, _LIMIT, _BIN, _BOUT, _PIN,
 _POUT, _AIN, _AOUT, _KIN, _KOUT) = range(len(CORE_ATTRS))


def _lit(v: bytes) -> Any:
    """Any literal's value (the rare one that is not plain: escapes, booleans, expressions, lists)."""
    return decode_literal(v.decode("utf-8", "replace"))


def _lit_text(v: bytes | None) -> str:
    if v is None:
        return ""
    inner = v[1:-1]
    if v[:1] == b'"' and v[-1:] == b'"' and 34 not in inner and 92 not in inner and len(v) > 1:   # no " or \\
        return inner.decode("utf-8", "replace")
    value = _lit(v)
    return "" if value is None else value if type(value) is str else str(value)


def _lit_int0(v: bytes | None) -> int:
    if v is None:
        return 0
    try:
        return int(v)
    except ValueError:
        return _num(_lit(v), int) or 0


def _lit_float0(v: bytes | None) -> float:
    return _lit_opt_float(v) or 0.0


def _lit_opt_float(v: bytes | None) -> float | None:
    if v is None:
        return None
    try:
        return float(v)
    except ValueError:
        return _num(_lit(v))


def _lit_value(v: bytes) -> Any:
    if v[:1] == b'"':
        return _lit_text(v)
    try:
        return int(v)
    except ValueError:
        try:
            return float(v)
        except ValueError:
            return _lit(v)


def row_from_literals(v: list, source: str, extra_keys: list[str]) -> tuple | None:
    """One cache row from a history file's literal text (bytes, or None when absent): `v` holds CORE_ATTRS,
    then the kept attributes named by `extra_keys` (extra_key form, sorted). Gives the same row as row_from_ad
    on the same ad from a schedd, as a plain tuple (worker processes send them back pickled: a tuple subclass
    pickles five times slower)."""
    b_in, b_out = v[_BIN], v[_BOUT]
    if b_in is None and b_out is None:
        return None
    gid = _lit_text(v[_GID])
    if not gid:
        return None
    extra = None
    if extra_keys:
        kept = []
        for i, k in enumerate(extra_keys, len(CORE_ATTRS)):
            x = v[i]
            if x is not None and (x := _lit_value(x)) is not None:
                kept.append((k, x))
        extra = extra_json(kept)
    host = _lit_text(v[_LRH]) or _lit_text(v[_RH])
    return (
        gid, source, _lit_text(v[_OWNER]), _lit_text(v[_ACCT]) or _lit_text(v[_ACCTING]),
        host.rpartition("@")[2], _lit_text(v[_TYPE]), _lit_int0(v[_DONE]) or _lit_int0(v[_ECS]),
        _lit_opt_float(v[_WALL]),
        _lit_int0(b_in), _lit_int0(b_out), _lit_int0(v[_PIN]), _lit_int0(v[_POUT]),
        _lit_float0(v[_AIN]), _lit_float0(v[_AOUT]), _lit_float0(v[_KIN]), _lit_float0(v[_KOUT]),
        _lit_opt_float(v[_LIMIT]), _lit_opt_float(v[_REQ]), extra,
    )


def row_from_finished(rec: Mapping[str, Any], ep: str) -> Row | None:
    """One cache row from larkd's finished-job record (lark/daemon/records.py FinishedStore) on this EP.

    Only records that carry the job's GlobalJobId can be matched with its history later; older ones are
    skipped rather than risk counting a job twice."""
    gid = rec.get("global_job_id")
    if not gid:
        return None
    started, ended = _num(rec.get("started")), _num(rec.get("ended"))
    wall = ended - started if started and ended else _num(rec.get("seconds"))
    return Row((
        str(gid), "ep", str(rec.get("owner") or ""), str(rec.get("accounting_group") or ""), ep,
        str(rec.get("network_type") or ""), int(ended or 0), wall,
        int(rec.get("bytes_in") or 0), int(rec.get("bytes_out") or 0),
        int(rec.get("packets_in") or 0), int(rec.get("packets_out") or 0),
        float(rec.get("avg_in_bps") or 0.0), float(rec.get("avg_out_bps") or 0.0),
        float(rec.get("peak_in_bps") or 0.0), float(rec.get("peak_out_bps") or 0.0),
        _num(rec.get("rate_limit_mbit")), _num(rec.get("request_bandwidth_mbit")), None,
    ))
