"""The pure parts of bench/paper_wan.py: the controller sections it writes, rates from the sink's samples, the
goals (group aggregate within 5%, even split within a group), the speed-up, the tables and the last line."""
from __future__ import annotations

import importlib.util
import math
import sys
import tomllib
from pathlib import Path

import pytest

_SPEC = importlib.util.spec_from_file_location(
    "paper_wan", Path(__file__).resolve().parents[2] / "bench" / "paper_wan.py")
bench = importlib.util.module_from_spec(_SPEC)
sys.modules[_SPEC.name] = bench  # dataclasses look their module up there
_SPEC.loader.exec_module(bench)

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "testbed"))
import pool  # noqa: E402


def test_policies_are_only_wan_groups_and_load_in_the_real_controller_config():
    from lark.controller.config import from_mapping
    text = bench.wan_policies({"cms": 900, "other": 100}, None)
    cfg = from_mapping(tomllib.loads(pool.controller_config(text)), base_dir=str(pool.POOL))
    assert cfg.policies == []
    assert [(g.name, g.rate_mbit) for g in cfg.wan_groups] == [("cms", 900.0), ("other", 100.0)]
    assert cfg.wan_groups[-1].select == "true" and cfg.wan_unmatched == "pass"
    off = from_mapping(tomllib.loads(pool.controller_config(bench.wan_policies(None))), base_dir=str(pool.POOL))
    assert off.wan_groups == [] and off.policies == []


def test_mechanism_key_is_written_when_asked():
    assert 'mechanism = "queue"' in bench.wan_policies({"cms": 250, "other": 100}, "queue")
    assert "mechanism" not in bench.wan_policies({"cms": 250, "other": 100}, None)
    data = tomllib.loads(bench.wan_policies({"cms": 250, "other": 100}, "meter"))
    assert data["wan"] == {"unmatched": "pass", "mechanism": "meter"}


def test_cms_group_selects_the_submit_files_accounting_group():
    import classad2
    from lark.controller.pipeline import selected
    data = tomllib.loads(bench.wan_policies({"cms": 250, "other": 100}, None))
    cms = classad2.ExprTree(data["wan_group"][0]["select"])
    assert selected(cms, classad2.ClassAd({"AcctGroup": "cms", "AccountingGroup": "cms.alice"}))
    assert not selected(cms, classad2.ClassAd({"Owner": "bob"}))


SAMPLES = [(100.0, {"a": 0}), (100.5, {"a": 0, "b": 0}), (101.0, {"a": 12_500_000, "b": 1_250_000}),
           (102.0, {"a": 25_000_000, "b": 2_500_000}), (103.0, {"a": 37_500_000, "b": 3_750_000})]


def test_rate_between_uses_the_samples_inside_the_window():
    assert bench.rate_between(SAMPLES, "a", 101.0, 103.0) == pytest.approx(100.0)
    assert bench.rate_between(SAMPLES, "b", 100.9, 102.5) == pytest.approx(10.0)
    assert math.isnan(bench.rate_between(SAMPLES, "a", 101.5, 101.9))   # fewer than two samples
    assert bench.rate_between(SAMPLES, "nobody", 100.0, 103.0) == 0.0


def test_series_is_per_second_and_sums_addresses():
    s = bench.series(SAMPLES, ["a", "b"], 101.0, 103.0)
    assert [t for t, _ in s] == [pytest.approx(0.0), pytest.approx(1.0), pytest.approx(2.0)]
    assert [v for _, v in s][1:] == [pytest.approx(110.0), pytest.approx(110.0)]


def test_within_and_split():
    assert bench.within(240.0, 250) and bench.within(262.4, 250) and not bench.within(237.0, 250)
    assert not bench.within(float("nan"), 250)
    assert bench.split(80.0, 100.0) == pytest.approx(0.8) and bench.split(100.0, 80.0) == pytest.approx(0.8)
    assert math.isnan(bench.split(0.0, 0.0))


def _fig10(cms=(124.0, 122.0), other=(49.0, 48.0)) -> "bench.Fig10":
    return bench.Fig10({"cms": 250, "other": 100}, {"cms-a": cms[0], "cms-b": cms[1], "other-1": other[0],
                                                   "other-2": other[1]},
                       {"cms": ["cms-a", "cms-b"], "other": ["other-1", "other-2"]}, {"cms": 262.0})


def test_fig10_goals_rate_and_split():
    f = _fig10()
    assert f.total("cms") == pytest.approx(246.0) and f.ratio("other") == pytest.approx(0.97)
    assert f.rate_ok("cms") and f.split_ok("cms") and f.rate_ok("other") and f.split_ok("other")
    uneven = _fig10(cms=(150.0, 98.0))
    assert uneven.rate_ok("cms") and not uneven.split_ok("cms")   # 98/150 = 0.65 < 0.85
    table = bench.fig10_table(uneven)
    lines = table.splitlines()
    assert lines[3].endswith("NOT met (split)") and "262.0" in lines[3] and lines[6].endswith("  met")


def test_fig12_speedup_paper_row_and_goal():
    managed = {1: {"goodput": {"cms-a": 870.0, "other-1": 96.0}},
               15: {"goodput": {"cms-a": 860.0, **{f"other-{i}": 6.0 + i / 10 for i in range(1, 16)}}}}
    unmanaged = {1: {"goodput": {"cms-a": 480.0, "other-1": 480.0}},
                 15: {"goodput": {"cms-a": 40.0, **{f"other-{i}": 60.0 for i in range(1, 16)}}}}
    rows = bench.fig12_rows(managed, unmanaged)
    assert [r.n for r in rows] == [1, 15]
    assert rows[0].speedup == pytest.approx(870 / 480) and rows[1].speedup == pytest.approx(21.5)
    assert rows[0].paper == 1.8 and rows[1].paper == 25.2
    assert rows[1].others_with == pytest.approx(90 + 12.0) and rows[1].others_min_with == pytest.approx(6.1)
    assert rows[1].cms_ratio == pytest.approx(860 / 900)
    table = bench.fig12_table(rows).splitlines()
    assert table[1].split()[:3] == ["1", "870.0", "0.967"] and table[2].split()[-3:] == ["21.5", "25.2", "met"]


def test_missing_runs_show_as_dashes_and_fail_the_goal():
    rows = bench.fig12_rows({2: {"goodput": {"cms-a": 700.0, "other-1": 50.0, "other-2": 50.0}}}, {})
    assert math.isnan(rows[0].speedup)
    assert rows[0].speedup != rows[0].speedup and bench.fig12_table(rows).splitlines()[1].split()[-1] == "met"
    assert "NOT met" in bench.fig12_table(bench.fig12_rows({2: {"goodput": {"cms-a": 700.0}}}, {}))
    # a job that could not upload at all without management has no finite speed-up (one run printed 44522.5)
    stuck = bench.fig12_rows({15: {"goodput": {"cms-a": 853.7}}}, {15: {"goodput": {"cms-a": 0.02}}})
    assert math.isnan(stuck[0].speedup) and bench.fig12_table(stuck).splitlines()[1].split()[-4:-2] == ["-", "25.2"]


def test_summary_line_counts_every_managed_group_aggregate():
    rows = bench.fig12_rows({1: {"goodput": {"cms-a": 870.0, "other-1": 96.0}},
                             2: {"goodput": {"cms-a": 800.0, "other-1": 40.0, "other-2": 40.0}}}, {})
    line = bench.summary(_fig10(cms=(124.0, 122.0), other=(60.0, 60.0)), rows)
    # fig10: cms ok, other 120/100 no; N=1: cms ok, other 96 ok; N=2: cms 800/900 no, other 80 no
    assert line == "cms_ratio_min=0.889 cms_ratio_max=0.967 groups_within_5pct=3/6"
    assert bench.summary(None, []) == "cms_ratio_min=nan cms_ratio_max=nan groups_within_5pct=0/0"


def test_parse_ns():
    assert bench.parse_ns(None, False) == [1, 2, 4, 8, 15]
    assert bench.parse_ns("4,1,4", False) == [1, 4]
    assert bench.parse_ns(None, True) == list(range(1, 16))
    with pytest.raises(ValueError):
        bench.parse_ns("0,3", False)
    with pytest.raises(ValueError):
        bench.parse_ns("16", False)


def test_jobs_two_cms_and_fifteen_others_fit_the_slots():
    jobs = bench.make_jobs()
    assert [j.label for j in jobs if j.group == "cms"] == ["cms-a", "cms-b"]
    assert len([j for j in jobs if j.group == "other"]) == bench.MAX_OTHERS
    assert {j.user for j in jobs if j.group == "other"} == {"bob", "carol"}
    assert len(jobs) <= bench.SLOTS_PER_EP * len(pool.EPS)


def test_pool_defaults_unchanged_and_bench_knobs_reach_the_eps():
    default = pool.condor_config("ep1")
    assert "NUM_SLOTS_TYPE_1 = 4\n" in default and "MEMORY = 4096\n" in default
    ep = pool.condor_config("ep1", 9, "MACHINE_RESOURCE_INVENTORY_Bandwidth =\n")
    assert "NUM_SLOTS_TYPE_1 = 9\n" in ep and ep.endswith("MACHINE_RESOURCE_INVENTORY_Bandwidth =\n")
    assert "LARK_DEFAULT_BANDWIDTH = unlimited" in pool.lark_knobs("ep1", {"default_bandwidth": "unlimited"})
    assert "DEFAULT_BANDWIDTH" not in pool.lark_knobs("ep1")
    assert pool.SDN_POLICIES in pool.controller_config() and pool.SDN_POLICIES not in pool.controller_config("")


def test_fair_link_has_one_class_per_source_and_redirects_everything_from_the_switch():
    cmds = bench.link_commands("fair", ["10.77.0.100", "10.77.0.150"])
    classes = [c for c in cmds if c[:2] == ["tc", "class"] and c[c.index("parent") + 1] == "1:1"]
    assert len(classes) == 3                                  # anything else + one per source
    assert all(c[c.index("ceil") + 1] == f"{bench.LINK_MBIT}mbit" for c in classes)
    assert len({c[c.index("rate") + 1] for c in classes}) == 1   # equal guarantees: an even split
    filters = [c for c in cmds if "flowid" in c]
    assert [c[c.index("src") + 1] for c in filters] == ["10.77.0.100/32", "10.77.0.150/32"]
    assert {c[c.index("flowid") + 1] for c in filters} == {"1:3", "1:4"}
    assert cmds[-1][-5:] == ["mirred", "egress", "redirect", "dev", "ifbw0"] and cmds[-2][4] == "w0"
    fifo = bench.link_commands("fifo", [])
    assert any(c[:3] == ["tc", "qdisc", "add"] and "tbf" in c for c in fifo) and not any("htb" in c for c in fifo)
    with pytest.raises(ValueError):
        bench.link_commands("wfq", [])


def test_queue_mechanism_names_the_pools_ovsdb_and_the_cores_namespace():
    """The controller runs in the CM's namespace: queues need the core switch's OVSDB and its namespace for tc."""
    from lark.controller.config import from_mapping
    text = bench.wan_policies({"cms": 250, "other": 100}, "queue", **bench.queue_place(pool))
    cfg = from_mapping(tomllib.loads(pool.controller_config(text)), base_dir=str(pool.POOL))
    assert cfg.wan_mechanism == "queue" and cfg.wan_ovsdb == f"unix:{pool.OVS_DIR}/db.sock"
    assert cfg.wan_tc_netns == "lark-pool-core"
    assert "tc_netns" not in bench.wan_policies({"cms": 250, "other": 100}, "meter", **bench.queue_place(pool))


def test_management_off_with_queues_keeps_the_mechanism_so_the_controller_removes_them():
    from lark.controller.config import from_mapping
    off = bench.wan_policies(None, "queue", **bench.queue_place(pool))
    cfg = from_mapping(tomllib.loads(pool.controller_config(off)), base_dir=str(pool.POOL))
    assert cfg.wan_groups == [] and cfg.wan_mechanism == "queue" and cfg.wan_tc_netns == "lark-pool-core"
    assert bench.wan_policies(None, "meter", **bench.queue_place(pool)) == ""


def test_switch_drops_are_summed_from_the_packet_sockets_and_shown_per_managed_round():
    """The core's packet sockets (ss -0 -m): a receive socket that overflowed shows d>0; the Fig. 12 table gives the
    drops of each managed round next to the cms job's goodput (a dip without drops would be something else)."""
    ss = ("p_raw UNCONN 0 0 [0]:* * skmem:(r0,rb212992,t0,tb212992,f0,w0,o176,bl0,d3155)\n"
          "p_raw UNCONN 0 0 [0]:* * skmem:(r0,rb212992,t170432,tb212992,f0,w0,o0,bl0,d0)\n"
          "p_raw UNCONN 0 0 [0]:* * skmem:(r0,rb212992,t0,tb212992,f0,w0,o176,bl0,d4640)\n")
    assert bench.socket_drops(ss) == 7795 and bench.socket_drops("") == 0
    rows = bench.fig12_rows({8: {"goodput": {"cms-a": 848.1, "other-1": 96.0}, "switch_drops": 212}},
                            {8: {"goodput": {"cms-a": 135.5}}})
    cells = bench.fig12_table(rows).splitlines()[1].split()
    assert rows[0].switch_drops_with == 212 and cells[:6] == ["8", "848.1", "0.942", "96.0", "96.0-96.0", "212"]


def test_uploaders_use_file_transfer_and_the_cms_jobs_their_group():
    cms, other = bench.make_jobs()[0], bench.make_jobs()[2]
    sub = bench.submit_file(cms, pool, "reno")
    for line in ("executable = /usr/bin/python3", "transfer_executable = false", "should_transfer_files = YES",
                 "when_to_transfer_output = ON_EXIT", "transfer_input_files = uploader.py", "log = log.txt",
                 "accounting_group = cms", f'arguments = "uploader.py cms-a {pool.WAN_SERVER} {bench.SINK_PORT} '
                 f'{pool.GATEWAY} reno"'):
        assert line + "\n" in sub
    assert "accounting_group" not in bench.submit_file(other, pool, "reno")


def test_a_run_whose_uploader_restarted_names_it(tmp_path, monkeypatch):
    """No figures from a run where a job started twice: the bench lists each such job from its event log."""
    monkeypatch.setattr(pool, "HOME", tmp_path)
    b = bench.Bench(pool, type("Args", (), {"mechanism": "queue"})())
    for n, j in enumerate(b.jobs[:3]):
        j.cluster = 30 + n
        d = b.path(j)
        d.mkdir(parents=True)
        events = ["001"] if n != 1 else ["001", "004", "001"]
        d.joinpath("log.txt").write_text("".join(
            f"{e} ({j.cluster:03d}.000.000) 2026-11-25 17:56:{40 + i} Job ...\n...\n" for i, e in enumerate(events)))
    assert b.restarts() == ["cms-b: job 31.0: started 2 times; its event log shows execute, evicted, execute"]
    assert b.live(b.jobs[0]) is None                        # its execute event names no scratch directory
