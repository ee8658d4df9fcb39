"""lark report: rows from ads, the cache (one row per job however often it is read), grouping and figures."""
import csv
import io
import json
import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lark.errors import LarkError
from lark.report import aggregate, importer, output
from lark.report.cache import Cache
from lark.report.fields import COLUMNS, Rejected, Row, row_from_ad, row_from_finished
from lark.report.sources import read_history_file

DAY = 86400
T0 = 1_793_491_200  # 2026-11-01 00:00 UTC


def ad(cluster, owner="alice", group="group_a", ep="ep1", bin_=1000, bout=100, completed=T0 + 3600, limit=None,
       req=None, peak_in=0.0, wall=10.0, schedd="s1", **more):
    a = {"GlobalJobId": f"{schedd}#{cluster}.0#1", "ClusterId": cluster, "ProcId": 0, "QDate": 1, "Owner": owner,
         "AcctGroup": group, "LastRemoteHost": f"slot1@{ep}", "CompletionDate": completed,
         "RemoteWallClockTime": wall, "LarkNetworkType": "nat", "NetworkIncomingBytes": bin_,
         "NetworkOutgoingBytes": bout, "NetworkIncomingPackets": 10, "NetworkOutgoingPackets": 5,
         "NetworkIncomingAvgRate": bin_ * 8 / wall, "NetworkOutgoingAvgRate": bout * 8 / wall,
         "NetworkIncomingPeakRate": peak_in, "NetworkOutgoingPeakRate": 0.0, "LarkFiguresBy": ep}
    if limit is not None:
        a["LarkBandwidthLimit"] = limit
    if req is not None:
        a["RequestBandwidth"] = req
    a.update(more)
    return a


def history_text(ads) -> str:
    """The format a schedd writes: `Attr = value` lines, then a `***` banner that ends the ad."""
    out = []
    for a in ads:
        for k, v in a.items():
            out.append(f'{k} = "{v}"' if isinstance(v, str) else f"{k} = {v}")
        out.append(f'*** ProcId = {a.get("ProcId", 0)} ClusterId = {a.get("ClusterId", 0)} Owner = "x" '
                   f'CompletionDate = {a.get("CompletionDate", 0)}')
    return "\n".join(out) + "\n"


@pytest.fixture
def cache(tmp_path):
    c = Cache(str(tmp_path / "c.sqlite"))
    yield c
    c.close()


def add_ads(cache, ads, extra=()):
    cache.add(r for r in (row_from_ad(a, "history", list(extra)) for a in ads) if isinstance(r, Row))


def test_row_needs_network_figures_a_marker_and_a_job_id():
    assert row_from_ad({"GlobalJobId": "s#1.0#1", "Owner": "a"}, "history", []) is None
    assert isinstance(row_from_ad({"NetworkIncomingBytes": 5}, "history", []), Rejected)
    assert isinstance(row_from_ad({"NetworkIncomingBytes": 5, "LarkFiguresBy": "ep1"}, "history", []), Rejected)
    r = row_from_ad(ad(1), "history", [])
    assert r.key == "s1#1.0#1#alice" and r.gid == "s1#1.0#1" and r.values[COLUMNS.index("ep")] == "ep1"


def test_group_by_owner_sums_and_counts(cache):
    add_ads(cache, [ad(1, bin_=100), ad(2, bin_=200), ad(3, owner="bob", bin_=5000)])
    rep = aggregate.summarise(cache.db, ["Owner"])
    by = {r["Owner"]: r for r in rep.rows}
    assert by["alice"]["jobs"] == 2 and by["alice"]["bytes_in"] == 300
    assert by["bob"]["jobs"] == 1 and by["bob"]["bytes_in"] == 5000
    assert rep.rows[0]["Owner"] == "bob"  # biggest first
    assert rep.totals()["bytes_in"] == 5300


def test_same_job_read_twice_counts_once(cache, tmp_path):
    f = tmp_path / "history"
    f.write_text(history_text([ad(1), ad(2)]))
    importer.import_history_file(cache, str(f))
    # The same jobs again from another copy of the file (a rotated file, a second schedd query...).
    g = tmp_path / "history.old"
    g.write_text(history_text([ad(1), ad(2)]))
    importer.import_history_file(cache, str(g))
    rep = aggregate.summarise(cache.db, [])
    assert rep.rows[0]["jobs"] == 2 and rep.rows[0]["bytes_in"] == 2000


def test_history_file_read_incrementally(cache, tmp_path):
    f = tmp_path / "history"
    f.write_text(history_text([ad(1)]))
    importer.import_history_file(cache, str(f))
    # The schedd appends one finished ad and is half-way through writing the next (no banner yet).
    with open(f, "a") as h:
        h.write(history_text([ad(2, bin_=7)]))
        h.write(history_text([ad(3, bin_=9)]).rpartition("***")[0])
    importer.import_history_file(cache, str(f))
    mark = cache.mark(f"file:{f}")
    assert cache.count() == 2
    assert mark[1] == len(history_text([ad(1)]) + history_text([ad(2, bin_=7)]))
    with open(f, "a") as h:
        h.write("*** ProcId = 0 ClusterId = 3\n")
    importer.import_history_file(cache, str(f))
    assert cache.count() == 3
    assert aggregate.summarise(cache.db, []).rows[0]["bytes_in"] == 1000 + 7 + 9


def test_rotated_history_file_read_from_start(cache, tmp_path):
    f = tmp_path / "history"
    f.write_text(history_text([ad(1), ad(2)]))
    importer.import_history_file(cache, str(f))
    os.unlink(f)
    f.write_text(history_text([ad(3)]))  # new inode, smaller than the old offset
    importer.import_history_file(cache, str(f))
    assert cache.count() == 3


def test_history_values_through_classad_when_not_plain(tmp_path):
    f = tmp_path / "h"
    f.write_text('GlobalJobId = "s#1.0#1"\nOwner = "a\\"b"\nNetworkIncomingBytes = 5\nX = true\nY = undefined\n'
                 'Z = 2 + 3\nR = 1.5e3\n*** ProcId = 0\n')
    (got, end), = list(read_history_file(str(f)))
    assert got["Owner"] == 'a"b' and got["X"] is True and got["Y"] is None and got["Z"] == 5
    assert got["R"] == 1500.0 and end == f.stat().st_size


def test_ep_record_and_history_count_once_and_larkds_record_wins(cache, tmp_path):
    fin = {"global_job_id": "s1#1.0#1", "job_id": "1.0", "owner": "alice", "accounting_group": "group_a",
           "bytes_in": 999, "bytes_out": 1, "started": T0, "ended": T0 + 50, "network_type": "nat",
           "rate_limit_mbit": 10}
    cache.add([row_from_finished(fin, "ep1")])
    assert aggregate.summarise(cache.db, []).rows[0]["bytes_in"] == 999
    add_ads(cache, [ad(1, bin_=1000)])   # the history's last push does not replace larkd's exact record
    rows = aggregate.summarise(cache.db, []).rows
    assert rows[0]["jobs"] == 1 and rows[0]["bytes_in"] == 999


def test_finished_record_without_global_id_is_skipped():
    assert row_from_finished({"bytes_in": 5, "job_id": "1.0"}, "ep1") is None


def test_finished_records_imported_from_store(cache, tmp_path):
    from lark.daemon.records import FinishedStore
    store = FinishedStore(str(tmp_path / "finished"))
    store.save("slot1", {"global_job_id": "s#5.0#1", "job_id": "5.0", "bytes_in": 10, "bytes_out": 20,
                         "ended": T0 + 5, "started": T0, "owner": "carol"})
    store.save("slot2", {"job_id": "6.0", "bytes_in": 10, "ended": T0 + 6})
    assert importer.import_finished(cache, str(tmp_path / "finished"), ep="ep9") == 1
    r = aggregate.summarise(cache.db, ["Owner", "EP"]).rows
    assert r == [{**r[0], "Owner": "carol", "EP": "ep9", "bytes_out": 20}]


def test_since_until_and_time_groups(cache):
    add_ads(cache, [ad(1, completed=T0 + 10), ad(2, completed=T0 + DAY + 10), ad(3, completed=T0 + 40 * DAY)])
    rep = aggregate.summarise(cache.db, ["day"], since=aggregate.parse_when("2026-11-01", "--since"),
                              until=aggregate.parse_when("2026-11-02T12:00", "--until"))
    assert sorted(r["day"] for r in rep.rows) == ["2026-11-01", "2026-11-02"]
    months = {r["month"]: r["jobs"] for r in aggregate.summarise(cache.db, ["month"]).rows}
    assert months == {"2026-11": 2, "2026-12": 1}
    weeks = aggregate.summarise(cache.db, ["week"]).rows
    assert sum(r["jobs"] for r in weeks) == 3 and all(r["week"].startswith("2026-W") for r in weeks)


def test_group_by_job_attribute_kept_at_import(cache):
    add_ads(cache, [ad(1, ProjectName="lhc"), ad(2, ProjectName="lhc"), ad(3, ProjectName="ska"), ad(4)],
            extra=["ProjectName"])
    got = {r["ProjectName"]: r["jobs"] for r in aggregate.summarise(cache.db, ["ProjectName"]).rows}
    assert got == {"lhc": 2, "ska": 1, "": 1}


def test_bad_group_and_date_name_the_fix():
    with pytest.raises(LarkError) as e:
        aggregate.group_sql("Owner; DROP TABLE jobs")
    assert "--by" in str(e.value)
    with pytest.raises(LarkError):
        aggregate.parse_when("last tuesday", "--since")


def test_requested_vs_used_and_hit_limit(cache):
    # 10 Mbit/s for 10 s lets 12.5 MB through; job 1 moved 6.25 MB (half) and peaked at the limit.
    add_ads(cache, [ad(1, bin_=6_250_000, limit=10, req=10, peak_in=9.6e6, wall=10),
                    ad(2, bin_=1_250_000, limit=10, req=10, peak_in=2e6, wall=10),
                    ad(3, owner="bob", bin_=100, wall=10)])
    by = {r["Owner"]: r for r in aggregate.summarise(cache.db, ["Owner"]).rows}
    a = by["alice"]
    assert a["hit_limit"] == 1
    assert a["used_of_reserved"] == pytest.approx((6_250_000 + 1_250_000) * 8 / (2 * 10e6 * 10))
    assert a["requested_mbit"] == 10 and a["used_mbit"] == pytest.approx((5.0 + 1.0) / 2)
    assert by["bob"]["used_of_reserved"] is None and by["bob"]["hit_limit"] == 0


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 30), st.sampled_from(["alice", "bob", "carol"]),
                          st.sampled_from(["g1", "g2"]), st.integers(0, 10**12), st.integers(0, 10**9)),
                max_size=60))
def test_grouped_totals_equal_per_job_totals(tmp_path_factory, jobs):
    """Whatever the order and repetition of reads, each group's total is the sum over its distinct jobs."""
    c = Cache(str(tmp_path_factory.mktemp("h") / "c.sqlite"))
    try:
        add_ads(c, [ad(cl, owner=o, group=g, bin_=bi, bout=bo) for cl, o, g, bi, bo in jobs])
        latest = {}
        for cl, o, g, bi, bo in jobs:
            latest[cl, o] = (o, g, bi, bo)   # a job (its id and Owner, which cannot change) read again replaces itself
        expect: dict = {}
        for o, g, bi, bo in latest.values():
            e = expect.setdefault((o, g), [0, 0, 0])
            e[0] += 1
            e[1] += bi
            e[2] += bo
        got = {(r["Owner"], r["AcctGroup"]): [r["jobs"], r["bytes_in"], r["bytes_out"]]
               for r in aggregate.summarise(c.db, ["Owner", "AcctGroup"]).rows}
        assert got == expect
    finally:
        c.close()


def test_outputs(cache, tmp_path):
    add_ads(cache, [ad(1, bin_=2_000_000_000, limit=100, req=100, wall=100),
                    ad(2, owner="bob", group="group_b", completed=T0 + DAY)])
    rep = aggregate.summarise(cache.db, ["Owner", "AcctGroup"])
    buf = io.StringIO()
    output.write_table(rep, buf)
    assert "alice" in buf.getvalue() and "2.00 GB" in buf.getvalue()
    buf = io.StringIO()
    output.write_csv(rep, buf)
    rows = list(csv.DictReader(io.StringIO(buf.getvalue())))
    assert rows[0]["Owner"] == "alice" and int(rows[0]["bytes_in"]) == 2_000_000_000
    buf = io.StringIO()
    output.write_json(rep, buf)
    data = json.loads(buf.getvalue())
    assert data["totals"]["jobs"] == 2 and data["groups"][1]["Owner"] == "bob"
    page = output.write_html(rep, aggregate.per_day_by(cache.db, "Owner", None, None), str(tmp_path / "html"))
    text = open(page).read()
    assert text.count("data:image/png;base64,") == 3 and "group_b" in text
    for name in ("per_day", "top", "requested_vs_used"):
        assert (tmp_path / "html" / f"{name}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_cli_report_from_history_file(tmp_path, capsys):
    from lark import cli
    f = tmp_path / "history"
    f.write_text(history_text([ad(1, bin_=10), ad(2, owner="bob", bin_=20)]))
    args = ["report", "--cache", str(tmp_path / "c.sqlite"), "--history-file", str(f), "--by", "Owner", "--json"]
    assert cli.main(args) == 0
    capsys.readouterr()
    assert cli.main(args) == 0   # a second run reads nothing new and counts nothing twice
    data = json.loads(capsys.readouterr().out)
    assert {g["Owner"]: g["bytes_in"] for g in data["groups"]} == {"alice": 10, "bob": 20}
    assert cli.main(["report", "--cache", str(tmp_path / "c.sqlite"), "--no-import", "--by", "x;y"]) == 1


def classad_of(d: dict):
    import classad2
    ad = classad2.ClassAd()
    for k, v in d.items():
        ad[k] = v
    return ad


class FakeSchedd:
    """Answers history() like a schedd: newest first in the order jobs entered the history (the list's order),
    stopping where `since` becomes true."""

    def __init__(self, ads):
        self.ads = ads
        self.calls = []

    def history(self, constraint=None, projection=(), match=-1, since=None):
        import classad2
        self.calls.append(since)
        out = []
        for a in reversed(self.ads):
            ad = classad_of(a)
            if since is not None and classad2.ExprTree(since).eval(ad) is True:
                break
            out.append(ad)
        return out


def test_schedd_history_read_incrementally_and_never_twice(cache, monkeypatch):
    from lark.report import sources
    ads = [dict(ad(i, completed=T0 + i * 100), EnteredCurrentStatus=T0 + i * 100) for i in range(1, 6)]
    schedd = FakeSchedd(ads)
    monkeypatch.setattr(sources, "schedds", lambda pool, name: [("submit1", schedd)])
    assert importer.import_schedds(cache) == 5
    assert schedd.calls == [None]
    schedd.ads = ads + [dict(ad(9, completed=T0 + 900), EnteredCurrentStatus=T0 + 900)]
    importer.import_schedds(cache)
    # The second run stops at the newest jobs the first one read (newest first).
    assert schedd.calls[1].startswith("(ClusterId == 5 && ProcId == 0 && QDate == 1) || (ClusterId == 4 && ")
    rep = aggregate.summarise(cache.db, [])
    assert rep.rows[0]["jobs"] == 6 and rep.rows[0]["bytes_in"] == 6000


def test_schedd_job_entering_history_late_is_not_lost(cache, monkeypatch):
    """A job whose ad reaches the history long after its EnteredCurrentStatus (spooled output fetched a day
    later, leave_in_queue, a removal) is the newest there with an old time. A scan that stops at a time mark
    (`EnteredCurrentStatus < last newest - 300`, the earlier way) stopped at it: it and every job that entered
    the history before it since the last run were never read."""
    from lark.report import sources
    first = [dict(ad(i, completed=T0 + i * 100), EnteredCurrentStatus=T0 + i * 100) for i in range(1, 4)]
    schedd = FakeSchedd(list(first))
    monkeypatch.setattr(sources, "schedds", lambda pool, name: [("submit1", schedd)])
    importer.import_schedds(cache)
    normal = dict(ad(4, completed=T0 + 400), EnteredCurrentStatus=T0 + 400)
    spooled = dict(ad(5, completed=T0 - DAY), EnteredCurrentStatus=T0 - DAY)
    schedd.ads += [normal, spooled]
    # What the time mark would have read: nothing (the spooled job is first and already "too old").
    assert schedd.history(since=f"EnteredCurrentStatus < {T0 + 300 - 300}") == []
    assert importer.import_schedds(cache) == 2
    assert {r["jobs"] for r in aggregate.summarise(cache.db, []).rows} == {5}
    assert importer.import_schedds(cache) == 0   # and a run with nothing new reads nothing
    assert aggregate.summarise(cache.db, []).rows[0]["jobs"] == 5


def test_schedd_history_cleared_is_read_again_without_counting_twice(cache, monkeypatch):
    from lark.report import sources
    schedd = FakeSchedd([dict(ad(i), EnteredCurrentStatus=T0 + i) for i in range(1, 4 + importer.SCHEDD_HEAD)])
    monkeypatch.setattr(sources, "schedds", lambda pool, name: [("submit1", schedd)])
    importer.import_schedds(cache)
    # The history was cleared and one of the old jobs came back with a new one (a restored copy): none of the
    # jobs the scan stops at is there, so it reads everything; the old job replaces itself.
    schedd.ads = [schedd.ads[0], dict(ad(99), EnteredCurrentStatus=T0 + 99)]
    assert importer.import_schedds(cache) == 2
    assert aggregate.summarise(cache.db, []).rows[0]["jobs"] == 4 + importer.SCHEDD_HEAD


def test_attribute_names_in_any_case(cache, tmp_path):
    """ClassAd names are case-insensitive: `--attr`/`--by` in any case find the ad's attribute in any case,
    from a history file and from a schedd's ad; condor_submit writes request_bandwidth as `Requestbandwidth`."""
    f = tmp_path / "history"
    f.write_text(history_text([ad(1, ProjectName="lhc", Requestbandwidth=100, LarkBandwidthLimit=100),
                               ad(2, projectname="lhc", ACCTGROUP="g2", AcctGroup=None),
                               ad(3, PROJECTNAME="ska", Site="x")]).replace('AcctGroup = "None"\n', ""))
    importer.import_history_file(cache, str(f), ["projectNAME", "SITE"])
    got = {r["projectname"]: r["jobs"] for r in aggregate.summarise(cache.db, ["projectname"]).rows}
    assert got == {"lhc": 2, "ska": 1}
    assert {r["ProjectName"] for r in aggregate.summarise(cache.db, ["ProjectName"]).rows} == {"lhc", "ska"}
    assert {r["site"]: r["jobs"] for r in aggregate.summarise(cache.db, ["site"]).rows} == {"x": 1, "": 2}
    assert {r["AcctGroup"] for r in aggregate.summarise(cache.db, ["AcctGroup"]).rows} == {"group_a", "g2"}
    assert aggregate.summarise(cache.db, ["Owner"]).rows[0]["requested_mbit"] == 100
    # The same from a schedd: the ad keeps its spelling, the row does not depend on it.
    from lark.report.sources import ad_values
    other = Cache(str(tmp_path / "s.sqlite"))
    try:
        importer.import_ads(other, [ad_values(classad_of(dict(ad(1), projectname="lhc", REQUESTBANDWIDTH=10)))],
                            ["ProjectName"])
        row = other.db.execute("SELECT extra, request_mbit FROM jobs").fetchone()
        assert json.loads(row[0])["projectname"] == "lhc" and row[1] == 10
    finally:
        other.close()


def test_week_is_the_iso_week():
    import datetime as dt

    from lark.report.cache import Cache as C
    c = C(":memory:")
    try:
        days = [dt.date(2026, 12, 27) + dt.timedelta(days=i) for i in range(12)] + [dt.date(2026, 11, 2),
                                                                                      dt.date(2027, 12, 31)]
        for i, d in enumerate(days):
            t = int(dt.datetime(d.year, d.month, d.day, 12, tzinfo=dt.UTC).timestamp())
            add_ads(c, [ad(i, completed=t)])
        got = dict(c.db.execute(f"SELECT gid, {aggregate.group_sql('week')} FROM jobs"))
        for i, d in enumerate(days):
            y, w, _ = d.isocalendar()
            assert got[f"s1#{i}.0#1"] == f"{y}-W{w:02d}", d
        assert got["s1#2.0#1"] == "2026-W53"   # Tuesday 2026-12-29
    finally:
        c.close()


def test_html_without_matplotlib_says_how_to_install_it(tmp_path, monkeypatch, capsys):
    import builtins

    from lark import cli
    real = builtins.__import__

    def no_matplotlib(name, *a, **k):
        if name == "matplotlib" or name.startswith("matplotlib."):
            raise ImportError("No module named 'matplotlib'")
        return real(name, *a, **k)
    monkeypatch.setattr(builtins, "__import__", no_matplotlib)
    f = tmp_path / "history"
    f.write_text(history_text([ad(1)]))
    assert cli.main(["report", "--cache", str(tmp_path / "c.sqlite"), "--history-file", str(f),
                     "--html", str(tmp_path / "html")]) == 1
    err = capsys.readouterr().err
    assert "matplotlib" in err and "pip install 'htcondor-lark[report]'" in err
    assert not (tmp_path / "html").exists() and not (tmp_path / "c.sqlite").exists()


def test_ad_values_evaluates_expressions_in_the_ad():
    import classad2

    from lark.report.sources import ad_values
    a = classad_of({"GlobalJobId": "s#1.0#1", "NetworkIncomingBytes": 7, "Owner": "alice"})
    a["Doubled"] = classad2.ExprTree("NetworkIncomingBytes * 2")
    a["Missing"] = classad2.ExprTree("NoSuchAttr")
    v = ad_values(a)
    assert v["Doubled"] == 14 and v["Missing"] is None and v["Owner"] == "alice"


_text_values = st.text(alphabet=st.characters(blacklist_categories=("Cs", "Cc")), max_size=12)


@settings(max_examples=25, deadline=None)
@given(st.lists(st.fixed_dictionaries(
    {"Owner": _text_values, "NetworkIncomingBytes": st.integers(0, 10**13)},
    optional={"AcctGroup": _text_values, "AccountingGroup": _text_values, "LastRemoteHost": _text_values,
              "RemoteHost": _text_values, "CompletionDate": st.integers(0, 2**31), "EnteredCurrentStatus":
              st.integers(1, 2**31), "RemoteWallClockTime": st.floats(0, 1e7), "NetworkOutgoingBytes":
              st.integers(0, 10**13), "NetworkIncomingPeakRate": st.floats(0, 1e11), "LarkBandwidthLimit":
              st.floats(0.5, 1e5), "LarkNetworkType": st.sampled_from(["nat", "bridge"]), "JobUniverse":
              st.integers(1, 12), "ProjectName": _text_values}), min_size=1, max_size=8))
def test_history_file_and_schedd_paths_store_the_same_rows(tmp_path_factory, ads):
    """A history file (literal text, decoded by type where used) and the same ads from a schedd (values
    already decoded by classad2) give identical cache rows; the file is written by classad2 in the old
    syntax a schedd writes, escapes included."""
    from lark.report.sources import ad_values
    d = tmp_path_factory.mktemp("eq")
    cads = []
    for i, a in enumerate(ads):
        c = classad_of({**a, "GlobalJobId": f'sub#{i}.0#"q"\\x', "ClusterId": i, "ProcId": 0, "QDate": 7,
                        "LarkFiguresBy": "ep"})
        cads.append(c)
    (d / "history").write_text("".join(c.printOld() + f"*** ProcId = 0 ClusterId = {i}\n"
                                       for i, c in enumerate(cads)))
    by_file, by_schedd = Cache(str(d / "f.sqlite")), Cache(str(d / "s.sqlite"))
    try:
        importer.import_history_file(by_file, str(d / "history"), ["ProjectName"])
        importer.import_ads(by_schedd, [ad_values(c) for c in cads], ["ProjectName"])
        q = "SELECT * FROM jobs ORDER BY gid"
        got_file, got_schedd = by_file.db.execute(q).fetchall(), by_schedd.db.execute(q).fetchall()
        assert len(got_schedd) == len(ads)
        assert [tuple(pytest.approx(v) if isinstance(v, float) else v for v in r) for r in got_file] == got_schedd
    finally:
        by_file.close()
        by_schedd.close()


def test_history_file_read_in_small_blocks_gives_the_same_ads(tmp_path):
    """Ads cut across read blocks are put back together; the offset is always after a whole ad."""
    f = tmp_path / "h"
    f.write_text(history_text([ad(i, bin_=i * 10) for i in range(1, 30)]))
    whole = [a for a, _ in read_history_file(str(f))]
    pieces = list(read_history_file(str(f), block=97))
    assert [a for a, _ in pieces] == whole and len(whole) == 29
    text = f.read_bytes()
    assert all(text[:end].endswith(b"\n") and text[:end].rstrip().splitlines()[-1].startswith(b"***")
               for _, end in pieces)


def test_cache_from_before_lower_case_names_is_upgraded(tmp_path):
    c = Cache(str(tmp_path / "c.sqlite"))
    add_ads(c, [ad(1)])
    c.db.execute("""UPDATE jobs SET extra = '{"ProjectName":"lhc","JobUniverse":5}'""")
    c.db.execute("PRAGMA user_version = 0")
    c.db.commit()
    c.close()
    c = Cache(str(tmp_path / "c.sqlite"))
    try:
        assert [r["projectname"] for r in aggregate.summarise(c.db, ["projectname"]).rows] == ["lhc"]
        assert c.db.execute("SELECT extra FROM jobs").fetchone()[0] == '{"jobuniverse":5,"projectname":"lhc"}'
    finally:
        c.close()
