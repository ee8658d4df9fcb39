"""Figures into the job's ad at its schedd, pushed by larkd (root), on a path the job cannot reach.

Hooks run as the job's user in the host's namespace, and a chirp path to these attributes would be the job's too,
so nothing the job can reach writes them. larkd edits the job ad at the job's schedd with htcondor2 (as
`condor_qedit` would): every `schedd_push_interval` while the job runs, at the job's end when its wrapper
asks (`push`: the starter waits for the wrapper, which is the job's process, so the job is still queued), and once
more at teardown if the counters changed since; a final push that fails is retried for `schedd_push_retry`
seconds. If larkd is down when the job ends, the wrapper waits for it up to `exit_barrier_wait`; past that the
job's history keeps the last periodic push and larkd's finished record keeps the exact figures (`lark report`).

For the job not to overwrite them, the schedd and shadow must refuse the job's own updates of these attributes:
list them in PROTECTED_JOB_ATTRS on the access point (docs/design.md, "Threat model"); larkd's identity (root on
the EP) must be a QUEUE_SUPER_USER there.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Callable

log = logging.getLogger(__name__)


def job_attributes(stats: dict) -> dict[str, str]:
    """ClassAd attribute name -> ClassAd literal, from larkd's stats answer (what the job's ad gets)."""
    usage = stats.get("usage") or stats.get("finished") or {}
    # An ended job's plan is gone with its record; its final summary keeps what the ad shows (a job shorter
    # than the first push would otherwise end without its type, address and the limit it ran under).
    plan = stats.get("plan") or {k: v for k, v in (stats.get("finished") or {}).items()
                                  if k in ("network_type", "ipv4", "rate_limit_mbit")}
    attrs: dict[str, str] = {}
    if plan:
        attrs["LarkNetworkType"] = f'"{plan.get("network_type", "")}"'
        if plan.get("ipv4"):
            attrs["LarkIPv4Address"] = f'"{plan["ipv4"]}"'
        if plan.get("ipv6"):
            attrs["LarkIPv6Address"] = f'"{plan["ipv6"]}"'
        if plan.get("inbound_port"):
            attrs["LarkInboundPort"] = str(int(plan["inbound_port"]))
        if plan.get("rate_limit_mbit"):
            attrs["LarkBandwidthLimit"] = f"{float(plan['rate_limit_mbit']):g}"
    if usage:
        for attr, key in (("NetworkIncomingBytes", "bytes_in"), ("NetworkOutgoingBytes", "bytes_out"),
                          ("NetworkIncomingPackets", "packets_in"), ("NetworkOutgoingPackets", "packets_out")):
            attrs[attr] = str(int(usage.get(key, 0)))
        for attr, key in (("NetworkIncomingAvgRate", "avg_in_bps"), ("NetworkOutgoingAvgRate", "avg_out_bps"),
                          ("NetworkIncomingPeakRate", "peak_in_bps"), ("NetworkOutgoingPeakRate", "peak_out_bps")):
            attrs[attr] = f"{float(usage.get(key, 0.0)):.1f}"
    if attrs:
        # The mark `lark report` counts figures by: only a queue super user can write it (the access point
        # protects it and refuses it at submit), so an ad with figures and without it was not written here.
        import socket
        attrs["LarkFiguresBy"] = '"' + socket.gethostname().replace("\\", "").replace('"', "") + '"'
    return attrs


def schedd_of(global_job_id: str) -> str:
    """The schedd's name from a GlobalJobId ("schedd#cluster.proc#qdate")."""
    return global_job_id.split("#", 1)[0] if "#" in global_job_id else ""


@dataclass
class Pending:
    global_job_id: str
    job_id: str
    attrs: dict[str, str]
    until: float


class AdPusher:
    def __init__(self, retry_seconds: float = 600.0, edit: Callable[[str, str, dict[str, str]], None] | None = None,
                 hold: Callable[[str, str, str], None] | None = None):
        self.retry_seconds = retry_seconds
        self.edit = edit or htcondor_edit
        self.hold_at = hold or htcondor_hold
        self.pending: dict[str, Pending] = {}   # key -> a final push not yet accepted
        # key -> (job id, its counters in the last push its schedd took): a final push that would say the same
        # is not sent (after the exit barrier's push the job usually leaves the queue before teardown)
        self.last_counters: dict[str, tuple[str, dict[str, str]]] = {}
        self._warned: dict[str, float] = {}

    def push(self, key: str, global_job_id: str, job_id: str, stats: dict) -> bool:
        """Push what larkd's `stats` answer says about a job; False (logged at most once a minute) on failure."""
        attrs = job_attributes(stats)
        if not attrs or not global_job_id:
            return False
        try:
            self.edit(schedd_of(global_job_id), job_id, attrs)
        except Exception as e:  # the schedd may be down or the job gone: never fatal for larkd
            now = time.monotonic()
            # Per job, not per slot: the failures of a slot's previous job (gone from the queue) must not hide
            # the next job's.
            if now - self._warned.get(job_id, -1e9) > 60:
                self._warned[job_id] = now
                log.warning("could not push figures of job %s to schedd %s: %s", job_id,
                            schedd_of(global_job_id) or "(local)", e)
            return False
        self.last_counters[key] = (job_id, counters(attrs))
        return True

    def hold(self, global_job_id: str, job_id: str, reason: str) -> bool:
        """Put a job on hold at its schedd (as root) with `reason`; False (logged) if the schedd would not."""
        try:
            self.hold_at(schedd_of(global_job_id), job_id, reason)
        except Exception as e:
            log.warning("could not hold job %s at schedd %s: %s", job_id, schedd_of(global_job_id) or "(local)", e)
            return False
        return True

    def push_final(self, key: str, global_job_id: str, job_id: str, summary: dict) -> bool:
        """The job's final figures; kept and retried by retry_pending() if the schedd does not take them now."""
        stats = {"finished": summary, "plan": {}}
        last_job, last = self.last_counters.pop(key, ("", {}))
        if last_job == job_id and last and last == counters(job_attributes(stats)):
            self.pending.pop(key, None)
            return True   # its schedd already has these counters (the exit barrier's push)
        if self.push(key, global_job_id, job_id, stats):
            self.last_counters.pop(key, None)
            self.pending.pop(key, None)
            return True
        self.pending[key] = Pending(global_job_id, job_id, job_attributes(stats),
                                    time.monotonic() + self.retry_seconds)
        return False

    def retry_pending(self) -> None:
        now = time.monotonic()
        for key, p in list(self.pending.items()):
            if now > p.until:
                log.warning("gave up pushing the final figures of job %s; they stay in larkd's finished records",
                            p.job_id)
                self.pending.pop(key, None)
                continue
            try:
                self.edit(schedd_of(p.global_job_id), p.job_id, p.attrs)
            except Exception:
                continue
            self.pending.pop(key, None)


HOLD_SUBCODE_SETUP_FAILED = 113  # HoldReasonSubCode of a job larkd held (111/112 come from PREPARE_JOB)
COUNTERS = ("NetworkIncomingBytes", "NetworkOutgoingBytes", "NetworkIncomingPackets", "NetworkOutgoingPackets")


def counters(attrs: dict[str, str]) -> dict[str, str]:
    return {a: attrs[a] for a in COUNTERS if a in attrs}


def htcondor_edit(schedd_name: str, job_id: str, attrs: dict[str, str]) -> None:
    """Set attributes of one job at its schedd, in one transaction (htcondor2, as root)."""
    import classad2
    import htcondor2 as ht
    coll = ht.Collector()
    loc = coll.locate(ht.DaemonType.Schedd, schedd_name) if schedd_name else coll.locate(ht.DaemonType.Schedd)
    schedd = ht.Schedd(loc)
    for attr, literal in attrs.items():
        if schedd.edit(job_id, attr, classad2.ExprTree(literal)) < 1:
            raise LookupError(f"the schedd no longer holds job {job_id}")


def htcondor_hold(schedd_name: str, job_id: str, reason: str) -> None:
    """Hold one job at its schedd (htcondor2, as root, a queue super user): the shadow is told to vacate it. The
    reason goes as a (text, subcode) tuple: htcondor2 25.14's `act` drops a reason given as a plain string (the
    job is held with HoldReason ""), and puts the text into a ClassAd string unescaped (a `"` leaves HoldReason
    undefined), so quotes and backslashes are replaced."""
    reason = reason.replace('"', "'").replace("\\", "/")
    import htcondor2 as ht
    coll = ht.Collector()
    loc = coll.locate(ht.DaemonType.Schedd, schedd_name) if schedd_name else coll.locate(ht.DaemonType.Schedd)
    result = ht.Schedd(loc).act(ht.JobAction.Hold, job_id, reason=(reason, HOLD_SUBCODE_SETUP_FAILED))
    if int(result.get("TotalSuccess", 0)) < 1:
        raise LookupError(f"the schedd did not hold job {job_id}: {result}")
