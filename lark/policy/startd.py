"""Authoritative ads for a running job, from HTCondor itself (htcondor2 bindings).

The slot ad (what was allocated: Bandwidth, RemoteOwner, AccountingGroup, STARTD_JOB_ATTRS) comes straight
from the local startd, whose address is the last argument of the job's root condor_starter. The job ad
(what the user asked for: Table I attributes) comes from the schedd that owns the job. Neither is read from
the sandbox, whose .job.ad/.machine.ad the job's user can edit.

Who the job is (issue 23 item 6) comes from the claim, which the startd vouches for: the schedd that claimed the
slot (RemoteScheddName, the name that schedd put in its claim request), the job it activated (JobId) and the user
the claim is for (RemoteUser/RemoteOwner). GlobalJobId is a plain job attribute its owner can qedit, so it only
names a schedd and a job when it agrees with the claim: the job ad is read from the schedd the startd named, for
the job id the startd named, and a job ad whose GlobalJobId, ClusterId/ProcId or User/Owner disagree is refused.
"""
from __future__ import annotations

import logging
import re
import time
from dataclasses import dataclass

import classad2

from ..errors import LarkError

log = logging.getLogger(__name__)
SLOT_WAIT = 10.0
# What the schedd writes: "<schedd name>#<cluster>.<proc>", with "#<submit time>" unless GLOBAL_JOB_ID_WITH_TIME is off
GLOBAL_JOB_ID_RE = re.compile(r"(?P<schedd>[^#]+)#(?P<job_id>\d+\.\d+)(?:#\d+)?")
IDENTITY_FIX = ("GlobalJobId must stay what the schedd gave the job at submit, <schedd>#<cluster>.<proc>#<time>: "
                "set it back with condor_qedit, or remove the job and submit it again")


@dataclass(frozen=True)
class JobIdentity:
    """A running job as the startd's claim names it, checked against the job's ad at its schedd."""
    schedd: str          # RemoteScheddName: where larkd reads the job ad and pushes its figures
    job_id: str          # JobId ("cluster.proc") at that schedd
    user: str            # RemoteUser (RemoteOwner): the job's User at that schedd
    global_job_id: str   # the job ad's GlobalJobId, once it agrees with the three above


def _string(ad: classad2.ClassAd, attr: str) -> str:
    v = ad.get(attr)
    return v if isinstance(v, str) else ""


def claimed_identity(slot: classad2.ClassAd) -> tuple[str, str, str]:
    """(schedd, job id, user) of the claim on this slot, from the startd's slot ad; refused if it names none."""
    schedd, job_id = _string(slot, "RemoteScheddName"), _string(slot, "JobId")
    user = _string(slot, "RemoteUser") or _string(slot, "RemoteOwner")
    slot_name = _string(slot, "Name") or "slot"
    missing = [a for a, v in (("RemoteScheddName", schedd), ("JobId", job_id), ("RemoteUser/RemoteOwner", user))
               if not v]
    if missing:
        raise LarkError(f"the startd's ad of this claimed slot lacks {', '.join(missing)}, so larkd cannot tell "
                        "which schedd and job it runs", job=job_id or None, obj=f"startd slot {slot_name}",
                        fix="run HTCondor 10.8 or later on the execution point and access point (the schedd names "
                            "itself in its claims from 10.8 on)")
    if not re.fullmatch(r"\d+\.\d+", job_id):
        raise LarkError(f"the startd's JobId {job_id!r} is not cluster.proc", job=job_id,
                        obj=f"startd slot {slot_name}", fix="check the startd")
    return schedd, job_id, user


def verify_job_identity(job: classad2.ClassAd, slot: classad2.ClassAd) -> JobIdentity:
    """The job's identity, once its ad (from its schedd) agrees with the startd's claim in everything larkd acts
    on: GlobalJobId names the claim's schedd and job (and is the one the job was activated with), ClusterId/ProcId
    are the claim's job, User (or, without one, Owner) is the claim's user. LarkError naming both values otherwise:
    a job that edited its GlobalJobId to name another schedd's or another user's job gets no network, and larkd
    never pushes figures or holds a job anywhere but at the claim's schedd, for the claim's job."""
    schedd, job_id, user = claimed_identity(slot)
    gid = _string(job, "GlobalJobId")
    cluster, proc = job.get("ClusterId"), job.get("ProcId")
    ad_job_id = f"{cluster}.{proc}" if isinstance(cluster, int) and isinstance(proc, int) else "(none)"

    def mismatch(what: str, job_value: str, claim_value: str) -> LarkError:
        return LarkError(f"the job ad's {what} {job_value!r} does not match the claim's {claim_value!r}; larkd "
                         "refuses to network a job whose identity disagrees with its claim", job=job_id,
                         obj=f"schedd {schedd}", fix=IDENTITY_FIX)
    parsed = GLOBAL_JOB_ID_RE.fullmatch(gid)
    if parsed is None:
        raise mismatch("GlobalJobId", gid, f"{schedd}#{job_id}#...")
    if parsed["schedd"] != schedd:
        raise mismatch("GlobalJobId's schedd", gid, f"RemoteScheddName {schedd}")
    if parsed["job_id"] != job_id:
        raise mismatch("GlobalJobId's job", gid, f"JobId {job_id}")
    slot_gid = _string(slot, "GlobalJobId")   # what the job was activated with (the shadow's copy at its start)
    if slot_gid and slot_gid != gid:
        raise mismatch("GlobalJobId", gid, f"GlobalJobId {slot_gid} the job was started with")
    if ad_job_id != job_id:
        raise mismatch("ClusterId.ProcId", ad_job_id, f"JobId {job_id}")
    # User is what the claim carries (RemoteUser is the claim request's User); Owner is its local part unless the
    # access point qualifies users otherwise, so Owner is compared only for a job ad without User.
    job_user = _string(job, "User")
    if job_user:
        if job_user != user:
            raise mismatch("User", job_user, f"RemoteUser {user}")
    elif _string(job, "Owner") != user.rsplit("@", 1)[0]:
        raise mismatch("Owner", _string(job, "Owner"), f"RemoteUser {user}")
    return JobIdentity(schedd=schedd, job_id=job_id, user=user, global_job_id=gid)


class StartdAdSource:
    def __init__(self, cfg):
        import htcondor2  # imported here: the files source and the unit tests do not need a pool
        self.htcondor = htcondor2
        self.cfg = cfg

    def _startd_address(self, starter) -> str:
        for arg in reversed(starter.argv):
            if arg.startswith("<") and arg.endswith(">"):
                return arg
        # Recent starters are not given the startd's address on the command line: ask the local collector
        # where this machine's startd is, then query the startd itself.
        ht = self.htcondor
        try:
            return ht.Collector().locate(ht.DaemonType.Startd)["MyAddress"]
        except (ht.HTCondorException, KeyError, ValueError) as e:
            raise LarkError(f"cannot locate the local startd: {e}", obj=f"starter pid {starter.pid}",
                            fix="check that the startd and collector run") from None

    def slot_ad(self, starter) -> classad2.ClassAd:
        ht = self.htcondor
        addr = self._startd_address(starter)
        deadline = time.time() + SLOT_WAIT
        while True:
            # Query the startd directly (as `condor_status -direct` does): the collector's copy lags.
            ads = ht.Collector(addr).query(ht.AdType.Startd, constraint=f"SlotName == {classad2.quote(starter.slot)}"
                                           f" || Name == {classad2.quote(starter.slot)}"
                                           f" || regexp(\"^{starter.slot}@\", Name)")
            for ad in ads:
                if ad.get("State") == "Claimed" and ad.get("JobId"):
                    return ad
            if time.time() > deadline:
                raise LarkError("the startd does not show this slot claimed by a job", job=f"slot {starter.slot}",
                                obj=f"startd {addr}", fix="check the startd log")
            time.sleep(0.2)

    def job_ad(self, slot: classad2.ClassAd, slot_name: str) -> classad2.ClassAd:
        """The job's ad at the schedd the startd says claimed the slot, for the job the startd says it runs (never
        where the job's own GlobalJobId points: its owner can edit that)."""
        ht = self.htcondor
        schedd_name, job_id, _ = claimed_identity(slot)
        cluster, _, proc = job_id.partition(".")
        try:
            loc = ht.Collector().locate(ht.DaemonType.Schedd, schedd_name)
            ads = ht.Schedd(loc).query(constraint=f"ClusterId == {int(cluster)} && ProcId == {int(proc)}")
        except (ValueError, ht.HTCondorException) as e:
            raise LarkError(f"cannot read the job ad from the schedd: {e}", job=job_id or f"slot {slot_name}",
                            obj=f"schedd {schedd_name}") from None
        if not ads:
            raise LarkError("the schedd does not know this job", job=job_id, obj=f"schedd {schedd_name}")
        return ads[0]

    def ads(self, starter) -> tuple[classad2.ClassAd, classad2.ClassAd]:
        """(job ad, slot ad), the job ad's identity checked against the claim (LarkError on any disagreement)."""
        try:
            slot = self.slot_ad(starter)
        except self.htcondor.HTCondorException as e:
            raise LarkError(f"cannot query the startd: {e}", job=f"slot {starter.slot}", obj="startd") from None
        job = self.job_ad(slot, starter.slot)
        verify_job_identity(job, slot)
        return job, slot

    def identity(self, job: classad2.ClassAd, slot: classad2.ClassAd) -> JobIdentity:
        """Where larkd pushes this job's figures (and holds it): the claim's schedd and job, checked again."""
        return verify_job_identity(job, slot)
