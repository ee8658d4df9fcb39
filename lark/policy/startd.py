"""Authoritative ads for a running job, from HTCondor itself (htcondor2 bindings).

The slot ad (what was allocated: Bandwidth, RemoteOwner, AccountingGroup, STARTD_JOB_ATTRS) comes straight
from the local startd, whose address is the last argument of the job's root condor_starter. The job ad
(what the user asked for: Table I attributes) comes from the schedd that owns the job. Neither is read from
the sandbox, whose .job.ad/.machine.ad the job's user can edit.
"""
from __future__ import annotations

import logging
import time

import classad2

from ..errors import LarkError

log = logging.getLogger(__name__)
SLOT_WAIT = 10.0


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
        ht = self.htcondor
        job_id = str(slot.get("JobId", ""))
        cluster, _, proc = job_id.partition(".")
        global_id = str(slot.get("GlobalJobId", ""))
        schedd_name = global_id.split("#", 1)[0] if "#" in global_id else None
        try:
            if schedd_name:
                loc = ht.Collector().locate(ht.DaemonType.Schedd, schedd_name)
            else:
                loc = ht.Collector().locate(ht.DaemonType.Schedd)
            ads = ht.Schedd(loc).query(constraint=f"ClusterId == {int(cluster)} && ProcId == {int(proc)}")
        except (ValueError, ht.HTCondorException) as e:
            raise LarkError(f"cannot read the job ad from the schedd: {e}", job=job_id or f"slot {slot_name}",
                            obj=f"schedd {schedd_name or '(local)'}") from None
        if not ads:
            raise LarkError("the schedd does not know this job", job=job_id, obj=f"schedd {schedd_name}")
        return ads[0]

    def ads(self, starter) -> tuple[classad2.ClassAd, classad2.ClassAd]:
        try:
            slot = self.slot_ad(starter)
        except self.htcondor.HTCondorException as e:
            raise LarkError(f"cannot query the startd: {e}", job=f"slot {starter.slot}", obj="startd") from None
        return self.job_ad(slot, starter.slot), slot
