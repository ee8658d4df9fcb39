"""Issue 23 item 6, execution-point part: a job's identity comes from its claim, not from its GlobalJobId.

GlobalJobId is a job attribute its owner can condor_qedit. larkd used to read the job ad from the schedd its
GlobalJobId named and push figures (and holds) there; across several schedds a forged id made larkd take another
user's job ad as the job's policy and write figures into that job as queue super user. Now the schedd and job id
come from the startd's slot ad (RemoteScheddName, JobId, RemoteUser: what the claim carries), and a job ad that
disagrees with them is refused. The fakes below stand for the collector, the startd and two schedds.
"""
import asyncio
import json
import os
import re

import classad2
import pytest
from helpers.fakekernel import fake_networker

from lark.daemon import server as server_mod
from lark.daemon.adpush import AdPusher
from lark.daemon.peercred import Peer, StarterInfo, start_time
from lark.errors import LarkError
from lark.names import job_key
from lark.policy.startd import JobIdentity, StartdAdSource, verify_job_identity

ME = os.getpid()
OWN_SCHEDD, VICTIM_SCHEDD = "ap1.example.net", "ap2.example.net"


def slot_ad(**over) -> classad2.ClassAd:
    """A claimed dynamic slot as the startd publishes it (condor_startd claim.cpp, Claim::publish)."""
    ad = {"Name": "slot1_1@ep.example.net", "SlotName": "slot1_1", "State": "Claimed", "Activity": "Busy",
          "RemoteScheddName": OWN_SCHEDD, "RemoteUser": "alice@example.net", "RemoteOwner": "alice@example.net",
          "ClientMachine": "ap1.example.net", "TotalBandwidth": 1000, "JobId": "3.0",
          "GlobalJobId": f"{OWN_SCHEDD}#3.0#1700000000"}
    ad.update(over)
    return classad2.ClassAd({k: v for k, v in ad.items() if v is not None})


def job_ad(**over) -> classad2.ClassAd:
    ad = {"ClusterId": 3, "ProcId": 0, "Owner": "alice", "User": "alice@example.net",
          "GlobalJobId": f"{OWN_SCHEDD}#3.0#1700000000"}
    ad.update(over)
    return classad2.ClassAd({k: v for k, v in ad.items() if v is not None})


def test_a_job_ad_that_agrees_with_its_claim_gives_the_claims_schedd_and_job():
    ident = verify_job_identity(job_ad(), slot_ad())
    assert ident == JobIdentity(schedd=OWN_SCHEDD, job_id="3.0", user="alice@example.net",
                                global_job_id=f"{OWN_SCHEDD}#3.0#1700000000")
    # GLOBAL_JOB_ID_WITH_TIME = false: no submit time in the id
    plain = f"{OWN_SCHEDD}#3.0"
    assert verify_job_identity(job_ad(GlobalJobId=plain), slot_ad(GlobalJobId=plain)).schedd == OWN_SCHEDD
    # A job ad without User (older schedds): its Owner is the claim's user's local part
    assert verify_job_identity(job_ad(User=None), slot_ad()).user == "alice@example.net"


@pytest.mark.parametrize("job_over, slot_over, named", [
    # another schedd's job 3.0 (bob's there): the cross-schedd redirection of issue 23 item 6
    ({"GlobalJobId": f"{VICTIM_SCHEDD}#3.0#1700000000"}, {}, VICTIM_SCHEDD),
    # the same, edited while idle, so the startd's copy from the job's activation is forged too
    ({"GlobalJobId": f"{VICTIM_SCHEDD}#3.0#1700000000"}, {"GlobalJobId": f"{VICTIM_SCHEDD}#3.0#1700000000"},
     VICTIM_SCHEDD),
    # another job at the job's own schedd
    ({"GlobalJobId": f"{OWN_SCHEDD}#9.0#1700000000"}, {}, f"{OWN_SCHEDD}#9.0#1700000000"),
    # edited after the job started: not the id the job was activated with
    ({"GlobalJobId": f"{OWN_SCHEDD}#3.0#1"}, {}, f"{OWN_SCHEDD}#3.0#1"),
    ({"GlobalJobId": "not a global job id"}, {}, "not a global job id"),
    ({"GlobalJobId": None}, {}, "GlobalJobId"),
    # the schedd answered with another job, or another user's
    ({"ClusterId": 4}, {}, "4.0"),
    ({"User": "bob@example.net"}, {}, "bob@example.net"),
    ({"User": None, "Owner": "bob"}, {}, "bob"),
])
def test_a_job_ad_that_disagrees_with_its_claim_is_refused_naming_both_values(job_over, slot_over, named):
    with pytest.raises(LarkError) as refused:
        verify_job_identity(job_ad(**job_over), slot_ad(**slot_over))
    e = refused.value
    assert e.job == "3.0" and named in str(e) and "does not match the claim's" in str(e)
    assert e.fix and "GlobalJobId must stay what the schedd gave the job" in e.fix


@pytest.mark.parametrize("missing", ["RemoteScheddName", "JobId"])
def test_a_slot_ad_that_names_no_claim_is_refused(missing):
    with pytest.raises(LarkError, match=f"lacks {missing}") as refused:
        verify_job_identity(job_ad(), slot_ad(**{missing: None}))
    assert "HTCondor 10.8 or later" in (refused.value.fix or "")
    with pytest.raises(LarkError, match="lacks RemoteUser/RemoteOwner"):
        verify_job_identity(job_ad(), slot_ad(RemoteUser=None, RemoteOwner=None))


class FakeHTCondor:
    """htcondor2 as StartdAdSource uses it: a collector that locates schedds by name, the local startd's slot ads
    and each schedd's queue. Records every schedd it was asked to locate."""

    class HTCondorException(Exception):
        pass

    class DaemonType:
        Schedd, Startd = "Schedd", "Startd"

    class AdType:
        Startd = "Startd"

    def __init__(self, slots: list[classad2.ClassAd], queues: dict[str, list[classad2.ClassAd]]):
        self.slots, self.queues, self.located = slots, queues, []
        fake = self

        class Collector:
            def __init__(self, address=None):
                pass

            def locate(self, daemon_type, name=None):
                fake.located.append(name)
                if daemon_type != fake.DaemonType.Schedd or name not in fake.queues:
                    raise fake.HTCondorException(f"no {daemon_type} named {name}")
                return {"Name": name}

            def query(self, ad_type, constraint="true"):
                return [ad for ad in fake.slots if classad2.ExprTree(constraint).eval(ad) is True]

        class Schedd:
            def __init__(self, location):
                self.jobs = fake.queues[location["Name"]]

            def query(self, constraint="true"):
                return [ad for ad in self.jobs if classad2.ExprTree(constraint).eval(ad) is True]

        self.Collector, self.Schedd = Collector, Schedd


def startd_source(fake: FakeHTCondor) -> StartdAdSource:
    source = StartdAdSource.__new__(StartdAdSource)   # without importing the real bindings' pool configuration
    source.htcondor, source.cfg = fake, None
    return source


STARTER = StarterInfo(pid=ME, start=start_time(ME), slot="slot1_1", exe="/usr/sbin/condor_starter",
                      argv=["condor_starter", "-f", "-a", "slot1_1", "<127.0.0.1:9618?addrs=127.0.0.1-9618>"])


def two_schedds(forged_gid: str | None) -> FakeHTCondor:
    """alice's job 3.0 at ap1 (its GlobalJobId possibly edited, while idle: the startd's copy too), bob's job 3.0 at
    ap2 (a network allowance alice's lacks)."""
    gid = forged_gid or f"{OWN_SCHEDD}#3.0#1700000000"
    alice = job_ad(GlobalJobId=gid)
    bob = job_ad(Owner="bob", User="bob@example.net", GlobalJobId=f"{VICTIM_SCHEDD}#3.0#1700000000",
                 LarkNetworkType="bridge")
    return FakeHTCondor([slot_ad(GlobalJobId=gid)], {OWN_SCHEDD: [alice], VICTIM_SCHEDD: [bob]})


def test_the_job_ad_is_read_from_the_schedd_the_startd_names_not_the_one_the_global_job_id_names():
    fake = two_schedds(forged_gid=f"{VICTIM_SCHEDD}#3.0#1700000000")
    source = startd_source(fake)
    assert source.job_ad(source.slot_ad(STARTER), "slot1_1")["Owner"] == "alice"   # not bob's ad from ap2
    assert fake.located == [OWN_SCHEDD]
    with pytest.raises(LarkError, match=re.escape(f"{VICTIM_SCHEDD}#3.0#1700000000")):
        source.ads(STARTER)
    job, slot = startd_source(two_schedds(forged_gid=None)).ads(STARTER)
    assert job["Owner"] == "alice" and slot["RemoteScheddName"] == OWN_SCHEDD


def _daemon(tmp_path, monkeypatch, fake: FakeHTCondor):
    """larkd on a fake kernel, its ads from the fake startd and schedds, its pushes and holds recorded."""
    net, kernel = fake_networker(str(tmp_path), monkeypatch, ad_source="files", ad_dir=str(tmp_path / "ads"))
    d = server_mod.Larkd(net.cfg)
    d.fw, d.net, d.records, d.acct, d.finished = net.fw, net, net.records, net.acct, net.finished
    d.ads = startd_source(fake)
    monkeypatch.setattr(server_mod.peercred, "authorize_job", lambda who, paths, *inodes: (STARTER, 4242))
    edits, holds = [], []
    d.pusher = AdPusher(edit=lambda schedd, job_id, attrs: edits.append((schedd, job_id, dict(attrs))),
                        hold=lambda schedd, job_id, reason: holds.append((schedd, job_id)))
    monkeypatch.setattr(d, "stats", lambda key: {"key": key, "plan": {"network_type": "nat"},
                                                 "usage": {"bytes_in": 5, "bytes_out": 7}})
    return d, kernel, edits, holds


def _setup(d):
    async def flow():
        d.loop = asyncio.get_running_loop()
        try:
            return await d.dispatch({"op": "setup"}, Peer(pid=ME, uid=1000, gid=1000))
        finally:
            for job in d.jobs:   # the fake starter is this test process: do not wait for its exit
                job.stop_watch(d.loop)
    return asyncio.run(flow())


def test_larkd_refuses_to_network_a_job_whose_global_job_id_names_another_schedds_job(tmp_path, monkeypatch):
    """The attack: alice qedits her idle job's GlobalJobId to name bob's job 3.0 at the other schedd. Her job gets
    no network, larkd reads nothing from that schedd, and writes and holds nothing anywhere."""
    d, kernel, edits, holds = _daemon(tmp_path, monkeypatch, two_schedds(f"{VICTIM_SCHEDD}#3.0#1700000000"))
    with pytest.raises(LarkError) as refused:
        _setup(d)
    message = str(refused.value)
    assert message.startswith("job 3.0: schedd ap1.example.net:") and VICTIM_SCHEDD in message
    assert f"RemoteScheddName {OWN_SCHEDD}" in message and "set it back with condor_qedit" in message
    d.push_running()
    assert edits == [] and holds == [] and kernel.objects == set() and d.active == set()
    assert VICTIM_SCHEDD not in d.ads.htcondor.located


def test_larkd_pushes_to_the_schedd_and_job_its_claim_names(tmp_path, monkeypatch):
    d, _, edits, holds = _daemon(tmp_path, monkeypatch, two_schedds(forged_gid=None))
    d.cfg.schedd_push_interval = 60.0
    answer = json.loads(_setup(d))
    assert answer["ok"] and answer["plan"]["job_id"] == "3.0"
    pin = d.pins.load(job_key("slot1_1"))
    assert (pin.schedd, pin.job_id, pin.global_job_id) == (OWN_SCHEDD, "3.0", f"{OWN_SCHEDD}#3.0#1700000000")
    d.push_running()
    assert [(schedd, job_id) for schedd, job_id, _ in edits] == [(OWN_SCHEDD, "3.0")]
    assert edits[0][2]["NetworkOutgoingBytes"] == "7" and holds == []
    assert d.ads.htcondor.located == [OWN_SCHEDD]
