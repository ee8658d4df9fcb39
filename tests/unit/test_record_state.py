"""A job record keeps the plan as decided and built (read-only) and the state that changes while the job runs in
fields of its own (the renewed DHCP lease, a fair-share job's rebalanced limit); a record of the larkd before those
fields loads with the same current values; one function writes finished records, for a job that ends with its
network and for one whose network went earlier (its figures carried by its pin)."""
from __future__ import annotations

import asyncio
import copy
import json
import os
import pickle

import pytest
from helpers.fakekernel import fake_networker

from lark.daemon import server as server_mod
from lark.daemon.metrics import node_totals
from lark.daemon.peercred import Peer, StarterInfo, start_time
from lark.daemon.records import FinishedStore, JobRecord, RecordStore
from lark.plan import JobNetwork, NetworkPlan

ME = os.getpid()
STARTER = StarterInfo(pid=ME, start=start_time(ME), slot="slot1", exe="/usr/sbin/condor_starter", argv=[])
JOB = Peer(pid=ME, uid=1000, gid=1000)
LEASE = {"address": "10.0.0.2", "prefix": 24, "server": "10.0.0.1", "obtained": 1000.0, "lease_time": 3600}


def _rec(**plan) -> JobRecord:
    net = JobNetwork(NetworkPlan(job_id="7.0", slot="slot1", key="slot1", **plan))
    return JobRecord(key="slot1", slot="slot1", job_id="7.0", starter_pid=1, starter_start=2, job_pid=3,
                     netns_inode=4, netns="lark-slot1", host_if="lkh-slot1", plan=net.to_dict(), phase="ready")


@pytest.mark.parametrize("write", [
    lambda p: p.__setitem__("rate_limit_mbit", 5.0), lambda p: p.__delitem__("ipv4"),
    lambda p: p.update(dhcp=LEASE), lambda p: p.pop("ipv4"), lambda p: p.setdefault("x", 1), lambda p: p.clear(),
    lambda p: p.popitem()])
def test_the_plan_of_a_record_is_read_only_new_and_loaded(tmp_path, write) -> None:
    store = RecordStore(str(tmp_path))
    rec = _rec(rate_limit_mbit=10.0)
    store.save(rec)
    loaded = RecordStore(str(tmp_path)).load("slot1")
    assert loaded is not None
    for r in (rec, loaded):
        with pytest.raises(TypeError, match="read-only"):
            write(r.plan)
        assert r.plan["rate_limit_mbit"] == 10.0 and "ipv4" in r.plan
    # Setup replaces it whole (each step's JobNetwork); the new one is read-only too.
    rec.plan = {**rec.plan, "ipv4": "10.77.0.2"}
    with pytest.raises(TypeError):
        write(rec.plan)
    # A copy is writable, and the plan serialises, copies and pickles as the dict it is.
    mine = dict(rec.plan)
    mine["ipv4"] = "x"
    assert json.loads(json.dumps(rec.plan))["ipv4"] == "10.77.0.2"
    assert copy.deepcopy(rec.plan) == rec.plan and pickle.loads(pickle.dumps(rec.plan)) == rec.plan


def test_current_lease_and_limit_come_from_the_records_fields_once_changed(tmp_path) -> None:
    rec = _rec(address_type="dhcp", fair_share_capacity_mbit=400.0, rate_limit_mbit=100.0)
    rec.plan = JobNetwork.from_dict(rec.plan).with_addresses(ipv4="10.0.0.2", dhcp=LEASE).to_dict()
    assert (rec.lease, rec.rate_limit_mbit) == (LEASE, 100.0)   # as set up
    renewed = {**LEASE, "obtained": 2000.0}
    rec.renewed_lease, rec.rebalanced_mbit = renewed, 50.0
    assert (rec.lease, rec.rate_limit_mbit) == (renewed, 50.0)
    assert (rec.plan["dhcp"], rec.plan["rate_limit_mbit"]) == (LEASE, 100.0)   # the plan stays as decided
    current = rec.current_plan()
    assert (current["dhcp"], current["rate_limit_mbit"]) == (renewed, 50.0)
    assert {k: v for k, v in current.items() if k not in ("dhcp", "rate_limit_mbit")} == \
        {k: v for k, v in rec.plan.items() if k not in ("dhcp", "rate_limit_mbit")}
    store = RecordStore(str(tmp_path))
    store.save(rec)
    again = RecordStore(str(tmp_path)).load("slot1")   # a restart reads the current values back
    assert again is not None and (again.lease, again.rate_limit_mbit) == (renewed, 50.0)


def test_a_record_of_the_previous_larkd_loads_with_the_same_current_values(tmp_path) -> None:
    """The larkd before these fields wrote a renewal and a rebalance into the plan: an upgrade that adopts the
    running job must see the lease to renew and release, and the limit it runs under."""
    renewed = {**LEASE, "obtained": 2000.0}
    old = {"key": "slot1", "slot": "slot1", "job_id": "7.0", "starter_pid": 1, "starter_start": 2, "job_pid": 3,
           "netns_inode": 4, "netns": "lark-slot1", "host_if": "lkh-slot1", "phase": "ready", "shaped": True,
           "created": 1000.0, "steps": ["veth"],     # a field of a still older version: dropped
           "plan": {**JobNetwork(NetworkPlan(job_id="7.0", slot="slot1", key="slot1", address_type="dhcp",
                                             fair_share_capacity_mbit=400.0)).to_dict(),
                    "ipv4": "10.0.0.2", "dhcp": renewed, "rate_limit_mbit": 50.0}}
    os.makedirs(tmp_path / "records")
    (tmp_path / "records" / "slot1.json").write_text(json.dumps(old))
    os.chmod(tmp_path / "records" / "slot1.json", 0o600)
    store = RecordStore(str(tmp_path / "records"))
    rec = store.load("slot1")
    assert rec is not None and rec.phase == "ready"
    assert (rec.renewed_lease, rec.rebalanced_mbit) == (None, None)
    assert (rec.lease, rec.rate_limit_mbit) == (renewed, 50.0)
    assert rec.current_plan() == old["plan"]
    with pytest.raises(TypeError):
        rec.plan["rate_limit_mbit"] = 60.0
    # The next rebalance goes to the new field; the old plan's value is then not read.
    rec.rebalanced_mbit = 60.0
    store.save(rec)
    on_disk = json.loads((tmp_path / "records" / "slot1.json").read_text())
    assert on_disk["rebalanced_mbit"] == 60.0 and on_disk["plan"]["rate_limit_mbit"] == 50.0
    assert RecordStore(str(tmp_path / "records")).load("slot1").rate_limit_mbit == 60.0   # type: ignore[union-attr]


def test_renewal_and_rebalance_write_the_records_fields_not_the_plan(tmp_path, monkeypatch) -> None:
    net, _ = fake_networker(str(tmp_path), monkeypatch)
    plan = NetworkPlan(job_id="7.0", slot="slot1", key="slot1", fair_share_capacity_mbit=400.0)
    rec = net.setup(plan, os.getpid(), 1, os.getpid(), 99)
    assert rec.shaped and rec.rate_limit_mbit and rec.rebalanced_mbit is None
    decided = dict(rec.plan)
    with net.fair.lock:   # a second fair-share job arrives: this one's share is rebalanced
        net.fair_rebalance(net._host_netlink(), JobNetwork(NetworkPlan(
            job_id="8.0", slot="slot2", key="slot2", fair_share_capacity_mbit=400.0)))
    assert rec.rebalanced_mbit is not None and rec.rebalanced_mbit < decided["rate_limit_mbit"]
    assert rec.rate_limit_mbit == rec.rebalanced_mbit and rec.plan == decided
    assert node_totals(net.records, net.acct, 1000.0)["active_jobs"] == 1
    summary = net.teardown("slot1", "job exited")
    assert summary is not None and summary["rate_limit_mbit"] == rec.rebalanced_mbit   # the limit it ended under
    assert net.finished.latest_for_key("slot1") == json.loads(json.dumps(summary))


COMMON = {"job_id", "key", "started", "ended", "reason", "bytes_in", "bytes_out"}
WITH_NETWORK = COMMON | {"slot", "network_type", "ipv4", "owner", "accounting_group", "global_job_id",
                         "rate_limit_mbit", "request_bandwidth_mbit"}


def test_finish_builds_both_kinds_of_summary(tmp_path) -> None:
    fin = FinishedStore(str(tmp_path))
    usage = {"bytes_in": 10, "bytes_out": 20}
    rec = _rec(rate_limit_mbit=10.0, owner="alice")
    rec.rebalanced_mbit = 5.0
    a = fin.finish("slot1", usage, "job exited", rec)
    b = fin.finish("slot2", usage, "starter exited", job_id="8.0", started=99.0)
    assert set(a) >= WITH_NETWORK and set(b) >= COMMON and not set(b) & (WITH_NETWORK - COMMON)
    assert (a["job_id"], a["owner"], a["rate_limit_mbit"], a["reason"]) == ("7.0", "alice", 5.0, "job exited")
    assert (b["job_id"], b["started"], b["reason"], b["bytes_in"]) == ("8.0", 99.0, "starter exited", 10)
    assert usage == {"bytes_in": 10, "bytes_out": 20}    # the caller's figures are not changed
    assert [s["key"] for s in fin.all()] == ["slot1", "slot2"]


def _larkd(tmp_path, monkeypatch):
    net, _ = fake_networker(str(tmp_path), monkeypatch, ad_source="files", ad_dir=str(tmp_path / "ads"))
    d = server_mod.Larkd(net.cfg)
    d.fw, d.net, d.records, d.acct, d.finished = net.fw, net, net.records, net.acct, net.finished
    monkeypatch.setattr(server_mod.peercred, "authorize_job", lambda who, paths, *inodes: (STARTER, 4242))
    monkeypatch.setattr(d, "plan_for", lambda st, key: NetworkPlan(job_id="1.0", slot=st.slot, key=key))
    monkeypatch.setattr(d, "watch", lambda key, pid, start: None)  # the starter here is this test process
    writes: list[dict] = []
    real = d.finished.finish

    def finish(*a, **kw):
        writes.append(real(*a, **kw))
        return writes[-1]
    monkeypatch.setattr(d.finished, "finish", finish)
    return d, writes


@pytest.mark.parametrize("released_before", [False, True])
def test_both_ends_of_a_job_write_its_finished_record_through_finish(tmp_path, monkeypatch, released_before):
    """A job that ends with its network (jobnet's teardown) and one whose network was released before it ended
    (larkd's release, from the figures its pin carried) each get one finished record, from FinishedStore.finish."""
    d, writes = _larkd(tmp_path, monkeypatch)

    async def flow():
        d.loop = asyncio.get_running_loop()
        assert b'"ok":true' in await d.dispatch({"op": "setup"}, JOB)
        if released_before:
            assert await d.release("slot1", "network released", final=False) is not None
            assert not d.finished.all() and d.records.load("slot1") is None
        return await d.release("slot1", "starter exited", final=True)

    summary = asyncio.run(flow())
    assert len(writes) == 1 and summary == writes[0]
    assert d.finished.all() == [json.loads(json.dumps(summary))]
    assert set(summary) >= (COMMON if released_before else WITH_NETWORK)
    assert (summary["job_id"], summary["key"], summary["reason"]) == ("1.0", "slot1", "starter exited")


def test_finished_records_are_pruned_to_keep_without_listing_at_every_save(tmp_path, monkeypatch) -> None:
    """The directory is listed at the first save and then only when the saves since pass `keep` (listing 10000
    names at every job's end cost ~13 ms); what is kept is still the newest `keep`, and a lowered keep (a reload)
    prunes at the next save."""
    for i in range(4):  # a former larkd's records
        (tmp_path / f"{1000 + i}-old{i}.json").write_text(json.dumps({"n": -1}))
    fin = FinishedStore(str(tmp_path), keep=5)
    listings = []
    real_listdir = os.listdir
    monkeypatch.setattr(os, "listdir", lambda d: listings.append(d) or real_listdir(d))
    t0 = 1_700_000_000.0   # names sort by their end in ms, as epoch milliseconds do (13 digits)
    fin.save("a", {"ended": t0 + 2, "n": 0})
    assert len(listings) == 1 and len(real_listdir(tmp_path)) == 5
    fin.save("b", {"ended": t0 + 3, "n": 1})
    assert len(listings) == 2 and sorted(real_listdir(tmp_path))[0] == "1001-old1.json"
    for n in range(2, 6):
        fin.save(f"k{n}", {"ended": t0 + 4 + n, "n": n})
    assert len(real_listdir(tmp_path)) == 5
    assert sorted(f["n"] for f in fin.all()) == [1, 2, 3, 4, 5]
    listed = len(listings)
    fin.keep = 2
    fin.save("z", {"ended": t0 + 100, "n": 6})
    assert len(listings) == listed + 1
    assert sorted(f["n"] for f in fin.all()) == [5, 6]


def test_a_full_finished_directory_is_listed_once_per_keep_hundredth_of_saves(tmp_path, monkeypatch) -> None:
    """At the steady state (the directory full), a save lists it only when keep // 100 more have come since."""
    fin = FinishedStore(str(tmp_path), keep=200)
    listings = []
    real_listdir = os.listdir
    monkeypatch.setattr(os, "listdir", lambda d: listings.append(d) or real_listdir(d))
    t0 = 1_700_000_000.0
    for n in range(206):
        fin.save(f"k{n}", {"ended": t0 + n, "n": n})
    assert len(listings) == 1 + 2   # the first save, then past 202 saves and again past 204 (200 left each time)
    assert len(real_listdir(tmp_path)) <= 202
    assert min(f["n"] for f in fin.all()) >= 206 - 202
