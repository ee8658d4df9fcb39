"""The job attributes a report reads, and how one job ad becomes one cache row."""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Mapping

# Attributes read from every history ad (the projection sent to the schedds). Network* and Lark* are written
# by lark/job/update_hook.py; the rest are HTCondor's own.
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
    """The job attributes kept for grouping: the defaults and `--attr` ones, each once, sorted."""
    return sorted(set(DEFAULT_EXTRA_ATTRS) | set(more or []))


# A job "hit its limit" when its peak rate in either direction reached this share of the limit: the shaper
# holds IP throughput at 0.95-0.96 of the configured rate (TCP/IP headers, docs/design.md), and the peak is a
# poll-interval average, so a saturated job reads a little under the limit.
HIT_LIMIT_SHARE = 0.9

COLUMNS = ["gid", "source", "owner", "acct_group", "ep", "network_type", "completed", "wall_s", "bytes_in",
           "bytes_out", "packets_in", "packets_out", "avg_in_bps", "avg_out_bps", "peak_in_bps", "peak_out_bps",
           "limit_mbit", "request_mbit", "extra"]


@dataclass(frozen=True)
class Row:
    values: tuple

    @property
    def gid(self) -> str:
        return self.values[0]


# One encoder for every row: json.dumps with options builds a new encoder per call, a quarter of the row cost.
_encode_extra = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str).encode


class RawAd(dict):
    """Attribute -> ClassAd literal text, as a history file has it (`"alice"`, `12`, `1.5e3`): row_from_ad
    decodes only the values it uses, each by the type it needs (int("12") costs a tenth of a literal parse)."""


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
    """An integer figure, 0 when absent or not a number (the fast path first: importing a million ads
    calls this ten million times). Literal text from a history file converts the same way."""
    if type(v) is int:
        return v
    try:
        return int(v)
    except (TypeError, ValueError):
        return _num(decode_literal(v) if type(v) is str else v, int) or 0


def _float0(v: Any) -> float:
    if type(v) in (float, int):
        return float(v)
    try:
        return float(v)
    except (TypeError, ValueError):
        return _num(decode_literal(v) if type(v) is str else v) or 0.0


def _opt_float(v: Any) -> float | None:
    """A figure that may be absent (a limit, a request): None stays None, also for `undefined` text."""
    if v is None or isinstance(v, bool):
        return None
    try:
        return float(v)
    except (TypeError, ValueError):
        return _num(decode_literal(v) if type(v) is str else v)


def _text(v: Any) -> str:
    return "" if v is None else v if type(v) is str else str(v)


def _raw_text(v: str | None) -> str:
    """A string literal of old ClassAd syntax: quotes off; `\\"` (its only escape) back to a quote."""
    if v is None:
        return ""
    if len(v) > 1 and v[0] == '"' and v[-1] == '"':
        inner = v[1:-1]
        return inner.replace('\\"', '"') if "\\" in inner else inner
    value = decode_literal(v)
    return "" if value is None else str(value)


def ep_of(remote_host: str) -> str:
    """`slot1_2@ep01.example.org` -> `ep01.example.org` (the EP, not the slot: bounded, and what admins mean)."""
    return remote_host.rpartition("@")[2] if remote_host else ""


def row_from_ad(ad: Mapping[str, Any], source: str, extra_attrs: list[str]) -> Row | None:
    """One cache row from a history ad: plain values (sources.ad_values of a classad2.ClassAd), or a RawAd
    of literal text from a history file. None for ads Lark never networked (no Network* figures) or without
    GlobalJobId."""
    get = ad.get
    raw = type(ad) is RawAd
    text = _raw_text if raw else _text
    gid = text(get("GlobalJobId"))
    b_in, b_out = get("NetworkIncomingBytes"), get("NetworkOutgoingBytes")
    if not gid or b_in is None and b_out is None:
        return None
    completed = _int0(get("CompletionDate")) or _int0(get("EnteredCurrentStatus"))
    extra = {a: ad[a] for a in extra_attrs if get(a) is not None}
    if extra and raw:
        extra = {a: decode_literal(v) for a, v in extra.items()}
    return Row((
        gid, source, text(get("Owner")), text(get("AcctGroup")) or text(get("AccountingGroup")),
        ep_of(text(get("LastRemoteHost")) or text(get("RemoteHost"))),
        text(get("LarkNetworkType")), completed, _opt_float(get("RemoteWallClockTime")),
        _int0(b_in), _int0(b_out), _int0(get("NetworkIncomingPackets")), _int0(get("NetworkOutgoingPackets")),
        _float0(get("NetworkIncomingAvgRate")), _float0(get("NetworkOutgoingAvgRate")),
        _float0(get("NetworkIncomingPeakRate")), _float0(get("NetworkOutgoingPeakRate")),
        _opt_float(get("LarkBandwidthLimit")), _opt_float(get("RequestBandwidth")),
        _encode_extra(extra) if extra else None,
    ))


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
