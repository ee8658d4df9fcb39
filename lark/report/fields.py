"""The job attributes a report reads, and how one job ad becomes one cache row."""
from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from typing import Any

# Attributes read from every history ad (the projection sent to the schedds). Network* and Lark* are written
# by larkd (lark/daemon/adpush.py); the rest are HTCondor's own.
CORE_ATTRS = [
    "GlobalJobId", "Owner", "AcctGroup", "AccountingGroup", "LastRemoteHost", "RemoteHost", "CompletionDate",
    "EnteredCurrentStatus", "JobCurrentStartDate", "RemoteWallClockTime", "RequestBandwidth",
    "LarkNetworkType", "LarkBandwidthLimit",
    "NetworkIncomingBytes", "NetworkOutgoingBytes", "NetworkIncomingPackets", "NetworkOutgoingPackets",
    "NetworkIncomingAvgRate", "NetworkOutgoingAvgRate", "NetworkIncomingPeakRate", "NetworkOutgoingPeakRate",
    "ClusterId", "ProcId", "QDate", "LarkFiguresBy",
]
# larkd writes this with every push of figures (the EP's name), and only a queue super user can: the access
# point protects it and refuses it at submit like the figures (condor_config.d/55-lark-access-point.conf). An ad
# with figures and without it was not written by larkd, and is not counted.
MARKER_ATTR = "LarkFiguresBy"
COUNT_ATTRS = ("NetworkIncomingBytes", "NetworkOutgoingBytes", "NetworkIncomingPackets", "NetworkOutgoingPackets")
RATE_ATTRS = ("NetworkIncomingAvgRate", "NetworkOutgoingAvgRate", "NetworkIncomingPeakRate",
              "NetworkOutgoingPeakRate")

# What no job's figures can exceed. The fastest Ethernet port a host has is 800 Gbit/s; twice that is beyond
# any job's link (two jobs on one EP talk through a veth pair and a bridge, memory-bound far below it). A job's
# bytes in either direction are at most that rate over its wall time (RemoteWallClockTime, every run summed),
# plus slack for a network that lives a little longer than the job (PREPARE_JOB to teardown); an ad without a
# wall time gets 30 days. A packet carries at least an IPv4 header (20 bytes).
MAX_LINK_BPS = 1.6e12
WALL_SLACK_S = 600.0
NO_WALL_S = 30 * 86400.0
MIN_PACKET_BYTES = 20
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

COLUMNS = ["key", "gid", "source", "owner", "acct_group", "ep", "network_type", "completed", "wall_s", "bytes_in",
           "bytes_out", "packets_in", "packets_out", "avg_in_bps", "avg_out_bps", "peak_in_bps", "peak_out_bps",
           "limit_mbit", "request_mbit", "extra"]


class Row(tuple):
    """One cache row: the values of COLUMNS, in order (a tuple: a million of them are built per import)."""
    __slots__ = ()

    @property
    def values(self) -> tuple:
        return self

    @property
    def key(self) -> str:
        return self[0]

    @property
    def gid(self) -> str:
        return self[1]


class Rejected(str):
    """Why a job's ad is not counted, naming the job and the attribute (a row builder's answer instead of a row)."""
    __slots__ = ()


def job_key(schedd: str, cluster: int, proc: int, qdate: int, owner: str) -> str:
    """A job's row key, from what its schedd vouches for: the schedd it was read from, ClusterId and ProcId
    (immutable in HTCondor), QDate (told apart from an earlier job of the same id after a queue reset) and
    Owner (immutable: whatever else an owner edits in their own job, GlobalJobId or QDate, the key stays theirs,
    so their ad can only ever replace a row of their own). GlobalJobId is not used: its owner can edit it."""
    return f"{schedd}#{cluster}.{proc}#{qdate}#{owner}"


def key_ids(key: str) -> tuple[int, int, int] | None:
    """(ClusterId, ProcId, QDate) of a row key (or of a GlobalJobId, the same up to the owner), None if it has
    none."""
    parts = key.split("#", 3)
    if len(parts) < 3:
        return None
    cluster, _, proc = parts[1].partition(".")
    try:
        return int(cluster), int(proc), int(parts[2])
    except ValueError:
        return None


_NAN = float("nan")


def _count(v: Any) -> int | float:
    """A counter's value: 0 when absent, NaN (rejected by figures_problem) when not a number."""
    if v is None:
        return 0
    t = type(v)
    if t is int:
        return v
    if t is float:
        return int(v) if math.isfinite(v) else v
    return _NAN


def _rate(v: Any) -> float:
    if v is None:
        return 0.0
    t = type(v)
    return float(v) if t is int or t is float else _NAN


def _ident(v: Any) -> int | None:
    return v if type(v) is int and v >= 0 else None


def figures_problem(job: str, wall: float | None, counts: tuple, rates: tuple) -> Rejected | None:
    """Why these figures cannot be a job's (negative, not a number, more than MAX_LINK_BPS moves in the job's
    wall time), or None."""
    seconds = (wall if wall is not None and 0 < wall < NO_WALL_S else NO_WALL_S) + WALL_SLACK_S
    byte_cap = MAX_LINK_BPS / 8 * seconds
    caps = (byte_cap, byte_cap, byte_cap / MIN_PACKET_BYTES, byte_cap / MIN_PACKET_BYTES)
    for attr, v, cap in zip(COUNT_ATTRS + RATE_ATTRS, counts + rates, (*caps, *(MAX_LINK_BPS,) * 4), strict=True):
        if v != v:
            return Rejected(f"job {job}: {attr} is not a number")
        if v < 0:
            return Rejected(f"job {job}: {attr} = {v} is negative")
        if v > cap:
            limit = (f"what a {MAX_LINK_BPS / 1e9:g} Gbit/s link moves in {seconds:g} s" if cap != MAX_LINK_BPS
                     else f"{MAX_LINK_BPS / 1e9:g} Gbit/s")
            return Rejected(f"job {job}: {attr} = {v} is more than {limit}")
    return None


def job_label(gid: str, cluster: int | None, proc: int | None) -> str:
    """How a warning names a job: its id as the schedd has it, then the GlobalJobId the ad says."""
    ident = f"{cluster}.{proc}" if cluster is not None and proc is not None else "(no ClusterId/ProcId)"
    return f"{ident} ({gid})" if gid else ident


def _unmarked(job: str) -> Rejected:
    return Rejected(f"job {job}: Network* figures without {MARKER_ATTR}, so not written by larkd "
                    "(forged, or from before Lark wrote the marker)")


def _no_id(job: str) -> Rejected:
    return Rejected(f"job {job}: no ClusterId/ProcId, so no key its schedd vouches for")


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
    if t is int or (t is float and math.isfinite(v)):
        return repr(v)
    return _encode_other(v)


def extra_json(kept: list[tuple[str, Any]]) -> str | None:
    """The kept attributes as the JSON object stored in `extra` ((extra_key, value) pairs, sorted, no None):
    built here rather than by json.dumps, which costs a new encoder per call."""
    if not kept:
        return None
    return "{" + ",".join(f'"{k}":{_json_value(v)}' for k, v in kept) + "}"


def row_from_ad(ad: Mapping[str, Any], source: str, extra_attrs: list[str], schedd: str | None = None
                ) -> Row | Rejected | None:
    """One cache row from a job ad as plain values (sources.ad_values of a classad2.ClassAd, whose names keep
    the ad's spelling: found here in any case), read from `schedd` (None: a history file, whose ads name their
    schedd only in GlobalJobId). None for ads Lark never networked (no Network* figures); Rejected for ads
    whose figures larkd did not write (no marker) or that no job can have."""
    get = {k.lower(): v for k, v in ad.items()}.get
    gid = _text(get("globaljobid"))
    b_in, b_out = get("networkincomingbytes"), get("networkoutgoingbytes")
    if b_in is None and b_out is None:
        return None
    cluster, proc = _ident(get("clusterid")), _ident(get("procid"))
    job = job_label(gid, cluster, proc)
    if not _text(get(MARKER_ATTR.lower())):
        return _unmarked(job)
    if cluster is None or proc is None:
        return _no_id(job)
    wall = _num(get("remotewallclocktime"))
    counts = (_count(b_in), _count(b_out), _count(get("networkincomingpackets")),
              _count(get("networkoutgoingpackets")))
    rates = (_rate(get("networkincomingavgrate")), _rate(get("networkoutgoingavgrate")),
             _rate(get("networkincomingpeakrate")), _rate(get("networkoutgoingpeakrate")))
    bad = figures_problem(job, wall, counts, rates)
    if bad:
        return bad
    owner = _text(get("owner"))
    key = job_key(gid.partition("#")[0] if schedd is None else schedd, cluster, proc,
                  _ident(get("qdate")) or 0, owner)
    kept = [(a, v) for a in sorted({extra_key(a) for a in extra_attrs}) if (v := get(a)) is not None]
    return Row((
        key, gid, source, owner, _text(get("acctgroup")) or _text(get("accountinggroup")),
        ep_of(_text(get("lastremotehost")) or _text(get("remotehost"))),
        _text(get("larknetworktype")), _int0(get("completiondate")) or _int0(get("enteredcurrentstatus")),
        wall, *counts, *rates,
        _num(get("larkbandwidthlimit")), _num(get("requestbandwidth")), extra_json(kept),
    ))


# -- the history-file fast path: literal text as bytes, straight from the file ---------------------------------
# Slots of CORE_ATTRS in the list sources.AttrMatcher fills (the kept attributes follow them).
(_GID, _OWNER, _ACCT, _ACCTING, _LRH, _RH, _DONE, _ECS, _START, _WALL, _REQ, _TYPE, _LIMIT, _BIN, _BOUT, _PIN,
 _POUT, _AIN, _AOUT, _KIN, _KOUT, _CLUSTER, _PROC, _QDATE, _MARKER) = range(len(CORE_ATTRS))


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


def _lit_number(v: bytes | None, parse: Callable[[bytes], Any], decoded: Callable[[Any], Any]) -> Any:
    """A number from its literal: absent is parse(b"0"), a plain one is parsed directly (nearly all), anything
    else goes through the ClassAd parser and then `decoded`."""
    if v is None:
        return parse(b"0")
    try:
        return parse(v)
    except ValueError:
        return decoded(_lit(v))


def _lit_int0(v: bytes | None) -> int:
    return _lit_number(v, int, lambda x: _num(x, int) or 0)


def _lit_count(v: bytes | None) -> int | float:
    return _lit_number(v, int, _count)


def _lit_rate(v: bytes | None) -> float:
    return _lit_number(v, float, _rate)


def _lit_ident(v: bytes | None) -> int | None:
    if v is None:
        return None
    try:
        n = int(v)
    except ValueError:
        return _ident(_lit(v))
    return n if n >= 0 else None


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


def row_from_literals(v: list, source: str, extra_keys: list[str]) -> tuple | Rejected | None:
    """One cache row from a history file's literal text (bytes, or None when absent): `v` holds CORE_ATTRS,
    then the kept attributes named by `extra_keys` (extra_key form, sorted). Gives the same row (or rejection)
    as row_from_ad on the same ad from a schedd, as a plain tuple (worker processes send them back pickled: a
    tuple subclass pickles five times slower)."""
    b_in, b_out = v[_BIN], v[_BOUT]
    if b_in is None and b_out is None:
        return None
    gid = _lit_text(v[_GID])
    cluster, proc = _lit_ident(v[_CLUSTER]), _lit_ident(v[_PROC])
    job = job_label(gid, cluster, proc)
    if not _lit_text(v[_MARKER]):
        return _unmarked(job)
    if cluster is None or proc is None:
        return _no_id(job)
    wall = _lit_opt_float(v[_WALL])
    counts = (_lit_count(b_in), _lit_count(b_out), _lit_count(v[_PIN]), _lit_count(v[_POUT]))
    rates = (_lit_rate(v[_AIN]), _lit_rate(v[_AOUT]), _lit_rate(v[_KIN]), _lit_rate(v[_KOUT]))
    bad = figures_problem(job, wall, counts, rates)
    if bad:
        return bad
    extra = None
    if extra_keys:
        kept = []
        for i, k in enumerate(extra_keys, len(CORE_ATTRS)):
            x = v[i]
            if x is not None and (x := _lit_value(x)) is not None:
                kept.append((k, x))
        extra = extra_json(kept)
    host = _lit_text(v[_LRH]) or _lit_text(v[_RH])
    owner = _lit_text(v[_OWNER])
    return (
        job_key(gid.partition("#")[0], cluster, proc, _lit_ident(v[_QDATE]) or 0, owner), gid, source, owner,
        _lit_text(v[_ACCT]) or _lit_text(v[_ACCTING]),
        host.rpartition("@")[2], _lit_text(v[_TYPE]), _lit_int0(v[_DONE]) or _lit_int0(v[_ECS]),
        wall, *counts, *rates, _lit_opt_float(v[_LIMIT]), _lit_opt_float(v[_REQ]), extra,
    )


def row_from_finished(rec: Mapping[str, Any], ep: str) -> Row | Rejected | None:
    """One cache row from larkd's finished-job record (lark/daemon/records.py FinishedStore) on this EP: its
    exact final figures, which win over the job's history ad (cache.Cache.add).

    Its key is the history's: the schedd and QDate from the GlobalJobId larkd saw in the job's ad, ClusterId
    and ProcId from the job id, Owner from the ad (immutable). Records without a GlobalJobId (older ones)
    cannot be matched with their history and are skipped (None) rather than counted twice; a GlobalJobId that
    names another job than the record's own (its owner edited it) is Rejected."""
    gid = str(rec.get("global_job_id") or "")
    if not gid:
        return None
    ids = key_ids(gid)
    job_id = str(rec.get("job_id") or "")
    if ids is None or (job_id and job_id != f"{ids[0]}.{ids[1]}"):
        return Rejected(f"job {job_id or gid}: larkd's finished record names GlobalJobId {gid!r}, which is not "
                        "this job's (edited by its owner); left to the job's history")
    owner = str(rec.get("owner") or "")
    started, ended = _num(rec.get("started")), _num(rec.get("ended"))
    wall = ended - started if started and ended else _num(rec.get("seconds"))
    return Row((
        job_key(gid.partition("#")[0], ids[0], ids[1], ids[2], owner), gid, "ep", owner,
        str(rec.get("accounting_group") or ""), ep,
        str(rec.get("network_type") or ""), int(ended or 0), wall,
        int(rec.get("bytes_in") or 0), int(rec.get("bytes_out") or 0),
        int(rec.get("packets_in") or 0), int(rec.get("packets_out") or 0),
        float(rec.get("avg_in_bps") or 0.0), float(rec.get("avg_out_bps") or 0.0),
        float(rec.get("peak_in_bps") or 0.0), float(rec.get("peak_out_bps") or 0.0),
        _num(rec.get("rate_limit_mbit")), _num(rec.get("request_bandwidth_mbit")), None,
    ))
