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


def _num(v: Any, cast=float) -> Any:
    if v is None or isinstance(v, bool):
        return None
    try:
        return cast(v)
    except (TypeError, ValueError):
        return None


def _int0(v: Any) -> int:
    """An integer figure, 0 when absent or not a number (the fast path first: importing a million ads
    calls this ten million times)."""
    return v if type(v) is int else (_num(v, int) or 0)


def _float0(v: Any) -> float:
    return float(v) if type(v) in (float, int) else (_num(v) or 0.0)


def ep_of(remote_host: str) -> str:
    """`slot1_2@ep01.example.org` -> `ep01.example.org` (the EP, not the slot: bounded, and what admins mean)."""
    return remote_host.rpartition("@")[2] if remote_host else ""


def row_from_ad(ad: Mapping[str, Any], source: str, extra_attrs: list[str]) -> Row | None:
    """One cache row from a history ad (any mapping: a classad2.ClassAd's evaluated values, or a parsed
    history-file record). None for ads Lark never networked (no Network* figures) or without GlobalJobId."""
    get = ad.get
    gid = get("GlobalJobId")
    b_in, b_out = get("NetworkIncomingBytes"), get("NetworkOutgoingBytes")
    if not gid or b_in is None and b_out is None:
        return None
    completed = _int0(get("CompletionDate")) or _int0(get("EnteredCurrentStatus"))
    extra = {a: ad[a] for a in extra_attrs if get(a) is not None}
    return Row((
        str(gid), source, str(get("Owner") or ""), str(get("AcctGroup") or get("AccountingGroup") or ""),
        ep_of(str(get("LastRemoteHost") or get("RemoteHost") or "")),
        str(get("LarkNetworkType") or ""), completed, _num(get("RemoteWallClockTime")),
        _int0(b_in), _int0(b_out), _int0(get("NetworkIncomingPackets")), _int0(get("NetworkOutgoingPackets")),
        _float0(get("NetworkIncomingAvgRate")), _float0(get("NetworkOutgoingAvgRate")),
        _float0(get("NetworkIncomingPeakRate")), _float0(get("NetworkOutgoingPeakRate")),
        _num(get("LarkBandwidthLimit")), _num(get("RequestBandwidth")),
        json.dumps(extra, sort_keys=True, default=str) if extra else None,
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
