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


def ep_of(remote_host: str) -> str:
    """`slot1_2@ep01.example.org` -> `ep01.example.org` (the EP, not the slot: bounded, and what admins mean)."""
    return remote_host.rpartition("@")[2] if remote_host else ""


def row_from_ad(ad: Mapping[str, Any], source: str, extra_attrs: list[str]) -> Row | None:
    """One cache row from a history ad (any mapping: a classad2.ClassAd's evaluated values, or a parsed
    history-file record). None for ads Lark never networked (no Network* figures) or without GlobalJobId."""
    gid = ad.get("GlobalJobId")
    if not gid or ad.get("NetworkIncomingBytes") is None and ad.get("NetworkOutgoingBytes") is None:
        return None
    completed = _num(ad.get("CompletionDate"), int) or _num(ad.get("EnteredCurrentStatus"), int) or 0
    extra = {a: ad[a] for a in extra_attrs if ad.get(a) is not None}
    return Row((
        str(gid), source, str(ad.get("Owner") or ""),
        str(ad.get("AcctGroup") or ad.get("AccountingGroup") or ""),
        ep_of(str(ad.get("LastRemoteHost") or ad.get("RemoteHost") or "")),
        str(ad.get("LarkNetworkType") or ""), completed, _num(ad.get("RemoteWallClockTime")),
        _num(ad.get("NetworkIncomingBytes"), int) or 0, _num(ad.get("NetworkOutgoingBytes"), int) or 0,
        _num(ad.get("NetworkIncomingPackets"), int) or 0, _num(ad.get("NetworkOutgoingPackets"), int) or 0,
        _num(ad.get("NetworkIncomingAvgRate")) or 0.0, _num(ad.get("NetworkOutgoingAvgRate")) or 0.0,
        _num(ad.get("NetworkIncomingPeakRate")) or 0.0, _num(ad.get("NetworkOutgoingPeakRate")) or 0.0,
        _num(ad.get("LarkBandwidthLimit")), _num(ad.get("RequestBandwidth")),
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
