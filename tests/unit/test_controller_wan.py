"""WAN group limits (issue 12): config parsing, group selection, per-job metering flows, meter counters."""
import pytest

from lark.controller import config as ccfg
from lark.controller.flows import T_FORWARD
from lark.controller.model import JobReg
from lark.controller.registry import Registry
from lark.controller.wan import METER_BASE, MeterCounters, WanPlan, is_lark_meter
from lark.errors import LarkError

SWITCH = {"wan_ports": ["wan0"], "site_prefixes": ["10.77.0.0/16", "fd77::/64"]}
GROUPS = [{"name": "cms", "select": 'AcctGroup =?= "cms" || regexp("^cms", AccountingGroup ?: "")', "rate_mbit": 250},
          {"name": "big", "select": "RequestBandwidth > 500", "rate_mbit": 900},
          {"name": "other", "select": "true", "rate_mbit": 100}]


def cfg(groups=GROUPS, **extra):
    return ccfg.from_mapping({"switch": SWITCH, "wan_group": groups, **extra})


def job(n=1, group="", addrs=None, bw=0.0):
    return JobReg.from_wire({"key": f"slot{n}", "job_id": f"{n}.0", "owner": "alice", "accounting_group": group,
                             "addresses": addrs or [f"10.77.1.{n}"], "mac": f"02:00:00:00:00:{n:02x}",
                             "request_bandwidth_mbit": bw}, "ep1")


def test_first_matching_group_wins_and_catch_all_is_other():
    c = cfg()
    plan = WanPlan(c.wan_groups, c.wan_unmatched)
    assert plan.group_of(job(group="cms")) == 0
    assert plan.group_of(job(group="cms.prod")) == 0
    assert plan.group_of(job(bw=800)) == 1
    assert plan.group_of(job(group="atlas")) == 2
    assert [g.burst_kbit for g in c.wan_groups] == [62500, 225000, 25000]   # 25% of the rate, in kbit


def test_one_metering_flow_per_address_and_none_when_unmatched_passes():
    plan = WanPlan(cfg().wan_groups)
    flows = plan.job_flows(job(group="cms", addrs=["10.77.1.5", "fd77::5"]))
    assert [(f.table, f.action) for f in flows] == [(T_FORWARD, ("meter_normal", METER_BASE))] * 2
    assert plan.meters_in(flows) == {METER_BASE}
    only_cms = WanPlan(cfg(GROUPS[:1]).wan_groups, "pass")
    assert only_cms.job_flows(job(group="atlas")) == []
    dropping = WanPlan(cfg(GROUPS[:1], wan={"unmatched": "drop"}).wan_groups, "drop")
    assert [f.action for f in dropping.job_flows(job(group="atlas"))] == [("drop",)]
    # site destinations bypass the meters: one flow per prefix (+ IPv6 link-local and multicast), none per job
    assert len(plan.base_flows(SWITCH["site_prefixes"])) == 4
    assert WanPlan([], "pass").base_flows(SWITCH["site_prefixes"]) == []


def test_registry_adds_the_metering_flow_to_the_jobs_flows():
    r = Registry(cfg())
    entry, _ = r.register(job(group="cms"))
    assert WanPlan.meters_in(entry.flows) == {METER_BASE}
    assert Registry(ccfg.from_mapping({"switch": SWITCH})).register(job())[0].flows[-1].action[0] != "meter_normal"


def test_meter_ids_mark_larks_meters():
    assert is_lark_meter(METER_BASE) and not is_lark_meter(1) and not is_lark_meter(METER_BASE + 0x400)


def test_counters_give_rate_between_polls():
    c = MeterCounters()
    c.update(1, METER_BASE, 1000, now=10.0)
    c.update(1, METER_BASE, 1000 + 12_500_000, now=11.0)
    st = c.status(WanPlan(cfg().wan_groups), {METER_BASE: 2})
    assert st[0]["rate_now_mbit"] == 100.0 and st[0]["bytes"] == 12_501_000 and st[0]["jobs"] == 2
    assert st[1]["bytes"] == 0


@pytest.mark.parametrize("groups,extra,words", [
    ([{"name": "x", "select": "true", "rate_mbit": 0}], {}, "rate_mbit"),
    ([{"name": "x", "select": "true", "rate_mbit": "fast"}], {}, "rate_mbit"),
    ([{"name": "x", "select": "Owner ==", "rate_mbit": 5}], {}, "not a ClassAd expression"),
    ([{"name": "x", "select": "true"}], {}, "name, select and rate_mbit"),
    ([{"name": "x", "select": "true", "rate_mbit": 5}] * 2, {}, "defined twice"),
    (GROUPS, {"wan": {"unmatched": "limit"}}, "unmatched"),
])
def test_bad_wan_config_is_refused_clearly(groups, extra, words):
    with pytest.raises(LarkError) as e:
        cfg(groups, **extra)
    assert words in str(e.value)


def test_groups_need_site_prefixes():
    with pytest.raises(LarkError, match="site_prefixes"):
        ccfg.from_mapping({"wan_group": GROUPS})


def test_shipped_wan_example_loads():
    c = ccfg.load("policies/wan_groups.toml")
    assert [g.name for g in c.wan_groups] == ["cms", "other"]
    assert [g.rate_mbit for g in c.wan_groups] == [250, 100]
