"""`lark report` counts only what larkd wrote (issue 23 item 16) and keys jobs on what their schedd vouches for
(item 6): each test performs the attack, through a history file and through a schedd, and checks the report."""
import logging
import sqlite3

import pytest
from test_report import T0, FakeSchedd, ad, history_text

from lark.report import aggregate, importer, sources
from lark.report.cache import Cache
from lark.report.fields import MAX_LINK_BPS, Rejected, row_from_ad, row_from_finished


@pytest.fixture
def cache(tmp_path):
    c = Cache(str(tmp_path / "c.sqlite"))
    yield c
    c.close()


def import_both_ways(tmp_path, monkeypatch, ads, extra=()):
    """The same ads through a history file and through a schedd, each into its own cache: (file, schedd)."""
    f = tmp_path / "history"
    f.write_text(history_text(ads))
    by_file = Cache(str(tmp_path / "file.sqlite"))
    importer.import_history_file(by_file, str(f), list(extra))
    by_schedd = Cache(str(tmp_path / "schedd.sqlite"))
    monkeypatch.setattr(sources, "schedds", lambda pool, name: [("s1", FakeSchedd(ads))])
    importer.import_schedds(by_schedd, extra_attrs=list(extra))
    return by_file, by_schedd


def per_owner(c: Cache) -> dict:
    return {r["Owner"]: (r["jobs"], r["bytes_in"]) for r in aggregate.summarise(c.db, ["Owner"]).rows}


def test_an_ad_with_figures_but_without_larkds_marker_is_not_counted(tmp_path, monkeypatch, caplog):
    """The attack: an ad carrying Network* figures larkd never wrote (a schedd without Lark's access-point
    config, a submit file or edit that slipped through). Before the fix every such ad was summed."""
    honest = ad(1, owner="alice", bin_=1000)
    forged = ad(2, owner="mallory", bin_=10**12)
    del forged["LarkFiguresBy"]
    with caplog.at_level(logging.WARNING, logger="lark.report.importer"):
        for c in import_both_ways(tmp_path, monkeypatch, [honest, forged]):
            assert per_owner(c) == {"alice": (1, 1000)}
            c.close()
    warned = [r.getMessage() for r in caplog.records]
    assert len(warned) == 2 and all("job 2.0 (s1#2.0#1)" in w and "LarkFiguresBy" in w for w in warned)


@pytest.mark.parametrize("attr, value, why", [
    ("NetworkIncomingBytes", -10**12, "is negative"),          # would cancel the group's other jobs
    ("NetworkOutgoingPackets", -1, "is negative"),
    ("NetworkIncomingBytes", "lots", "is not a number"),
    ("NetworkIncomingBytes", True, "is not a number"),
    ("NetworkIncomingBytes", 10**15, "more than what a 1600 Gbit/s link moves in 610 s"),   # 10 s of wall
    ("NetworkIncomingPackets", 10**14, "more than what a 1600 Gbit/s link moves"),
    ("NetworkIncomingPeakRate", 1e13, "is more than 1600 Gbit/s"),
    ("NetworkOutgoingAvgRate", float("inf"), "is more than 1600 Gbit/s"),
])
def test_negative_non_numeric_and_absurd_figures_are_rejected_with_a_warning(tmp_path, monkeypatch, caplog,
                                                                             attr, value, why):
    """The attack: a marked ad whose figure no job can have (a forged or corrupted one). Before the fix a
    negative figure was summed (it took bytes off the owner's group), a string or boolean counted as 0, and any
    size was believed."""
    good = ad(1, owner="alice", group="g", bin_=5000, wall=10)
    bad = ad(2, owner="alice", group="g", bin_=1000, wall=10, **{attr: value})
    with caplog.at_level(logging.WARNING, logger="lark.report.importer"):
        for c in import_both_ways(tmp_path, monkeypatch, [good, bad]):
            assert per_owner(c) == {"alice": (1, 5000)}
            c.close()
    warned = [r.getMessage() for r in caplog.records]
    assert len(warned) == 2
    assert sorted(w.partition(": job")[0] for w in warned) == sorted([str(tmp_path / "history"), "schedd s1"])
    assert all("job 2.0 (s1#2.0#1)" in w and attr in w and why in w and "not counted" in w for w in warned)


def test_the_cap_follows_the_wall_time_and_an_honest_busy_job_is_counted(cache):
    """The bound is the link's rate over the job's wall time: a job that really moved at 600 Gbit/s for two
    hours is counted; the same bytes in a job of one second are not."""
    hour, rate = 7200.0, 600e9
    busy = dict(bin_=int(rate / 8 * hour), NetworkIncomingAvgRate=rate, NetworkIncomingPeakRate=rate)
    assert not isinstance(row_from_ad(ad(1, wall=hour, **busy), "history", []), Rejected)
    short = row_from_ad(ad(1, wall=1.0, **busy), "history", [])
    assert isinstance(short, Rejected) and "NetworkIncomingBytes" in short and "in 601 s" in short
    no_wall = {k: v for k, v in ad(1, **busy).items() if k != "RemoteWallClockTime"}
    assert not isinstance(row_from_ad(no_wall, "history", []), Rejected)   # 30 days without a wall time
    assert isinstance(row_from_ad(ad(1, NetworkIncomingPeakRate=MAX_LINK_BPS * 1.01), "history", []), Rejected)


def test_larkds_finished_record_wins_over_the_history_ad(cache):
    """The history holds the last figures larkd pushed before the job left the queue; larkd's finished record
    holds the exact final ones. Before the fix the history replaced the record."""
    fin = {"global_job_id": "s1#1.0#1", "job_id": "1.0", "owner": "alice", "accounting_group": "group_a",
           "bytes_in": 5_000_000, "bytes_out": 7, "started": T0, "ended": T0 + 50, "network_type": "nat"}
    history = ad(1, bin_=4_000_000, ProjectName="lhc")
    for order in ([history, fin], [fin, history]):
        c = Cache(":memory:")
        for what in order:
            if what is fin:
                c.add([row_from_finished(fin, "ep1.example.org")])   # larkd's host name for the EP
            else:
                c.add([row_from_ad(history, "history", ["ProjectName"])])
        rows = aggregate.summarise(c.db, ["ProjectName"]).rows
        assert [(r["ProjectName"], r["jobs"], r["bytes_in"]) for r in rows] == [("lhc", 1, 5_000_000)], order
        # and the EP keeps the name the schedd gives it (LastRemoteHost), as in every other row of that EP
        assert [r["EP"] for r in aggregate.summarise(c.db, ["EP"]).rows] == ["ep1"], order
        c.close()


def test_a_forged_global_job_id_cannot_replace_another_jobs_row(tmp_path, monkeypatch):
    """The attack: mallory edits her job's GlobalJobId (not immutable in HTCondor) to bob's, so her small ad
    would replace bob's row. Before the fix the cache was keyed by GlobalJobId and bob's 10 GB disappeared."""
    victim = ad(1, owner="bob", bin_=10**10)
    attacker = ad(2, owner="mallory", bin_=1, GlobalJobId="s1#1.0#1")
    for c in import_both_ways(tmp_path, monkeypatch, [victim, attacker]):
        assert per_owner(c) == {"bob": (1, 10**10), "mallory": (1, 1)}
        c.close()


def test_a_finished_record_with_a_forged_global_job_id_replaces_nothing(cache, caplog):
    """The same edit made before the job started reaches larkd's record, which now wins over history: it must
    neither replace bob's row nor count. Its GlobalJobId names another job than its own id: rejected."""
    cache.add([row_from_ad(ad(1, owner="bob", bin_=10**10), "history", [])])
    forged = {"global_job_id": "s1#1.0#1", "job_id": "2.0", "owner": "mallory", "bytes_in": 1,
              "started": T0, "ended": T0 + 5}
    assert isinstance(row_from_finished(forged, "ep1"), Rejected)
    # An edit that keeps the id but names bob's schedd and QDate: the Owner in the key keeps it off bob's row.
    same_id = {**forged, "job_id": "1.0"}
    cache.add([row_from_finished(same_id, "ep1")])
    assert per_owner(cache) == {"bob": (1, 10**10), "mallory": (1, 1)}


def test_a_forged_global_job_id_cannot_stop_the_schedd_scan_early(cache, monkeypatch):
    """The attack: a new job whose GlobalJobId is edited to name one of the jobs the last run read. Before the
    fix the next scan stopped at it (`since GlobalJobId == ...`): it and every job older than it were lost."""
    first = [ad(i) for i in range(1, 4)]
    schedd = FakeSchedd(list(first))
    monkeypatch.setattr(sources, "schedds", lambda pool, name: [("s1", schedd)])
    importer.import_schedds(cache)
    schedd.ads += [ad(4, owner="bob", bin_=777), ad(5, owner="mallory", GlobalJobId="s1#3.0#1"), ad(6)]
    assert importer.import_schedds(cache) == 3
    assert per_owner(cache) == {"alice": (4, 4000), "bob": (1, 777), "mallory": (1, 1000)}


def test_a_cache_keyed_by_global_job_id_is_migrated(tmp_path):
    """A cache from before (keyed by GlobalJobId, heads as GlobalJobIds) gets the new key; an honest job read
    again replaces its old row instead of counting twice, and the scan stops where it stopped before."""
    path = str(tmp_path / "old.sqlite")
    db = sqlite3.connect(path)
    db.executescript("""
        CREATE TABLE jobs (gid TEXT PRIMARY KEY, source TEXT NOT NULL, owner TEXT, acct_group TEXT, ep TEXT,
            network_type TEXT, completed INTEGER, wall_s REAL, bytes_in INTEGER, bytes_out INTEGER,
            packets_in INTEGER, packets_out INTEGER, avg_in_bps REAL, avg_out_bps REAL, peak_in_bps REAL,
            peak_out_bps REAL, limit_mbit REAL, request_mbit REAL, extra TEXT);
        CREATE INDEX jobs_completed ON jobs(completed);
        CREATE TABLE marks (source TEXT PRIMARY KEY, a INTEGER, b INTEGER);
        CREATE TABLE heads (source TEXT NOT NULL, gid TEXT NOT NULL);
        INSERT INTO jobs VALUES ('s1#1.0#1', 'history', 'alice', 'group_a', 'ep1', 'nat', 1793494800, 10.0,
            1000, 100, 10, 5, 800.0, 80.0, 0.0, 0.0, NULL, NULL, '{"ProjectName":"lhc"}');
        INSERT INTO heads VALUES ('schedd:s1', 's1#1.0#1');
        PRAGMA user_version = 0;""")
    db.close()
    c = Cache(path)
    try:
        assert c.heads("schedd:s1") == ["s1#1.0#1"]
        assert sources.since_jobs(c.heads("schedd:s1")) == "(ClusterId == 1 && ProcId == 0 && QDate == 1)"
        c.add([row_from_ad(ad(1, bin_=1000), "history", [])])
        assert per_owner(c) == {"alice": (1, 1000)}
        assert [r["projectname"] for r in aggregate.summarise(c.db, ["projectname"]).rows] == ["lhc"]
    finally:
        c.close()


def test_larkd_marks_every_push_of_figures_and_nothing_else():
    from lark.daemon.adpush import job_attributes
    pushed = job_attributes({"usage": {"bytes_in": 5}, "plan": {"network_type": "nat"}})
    assert pushed["LarkFiguresBy"].startswith('"') and len(pushed["LarkFiguresBy"]) > 2
    assert job_attributes({}) == {}


def test_the_access_point_protects_the_marker_and_refuses_it_at_submit(tmp_path):
    from test_access_point_config import knobs, true_for
    k = knobs(tmp_path, "PROTECTED_JOB_ATTRS", "SUBMIT_REQUIREMENT_LarkFigures")
    assert "LarkFiguresBy" in k["PROTECTED_JOB_ATTRS"].split()
    assert true_for(k["SUBMIT_REQUIREMENT_LarkFigures"])
    assert not true_for(k["SUBMIT_REQUIREMENT_LarkFigures"], LarkFiguresBy="ep1.example.org")
