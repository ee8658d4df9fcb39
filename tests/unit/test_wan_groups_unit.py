"""WAN group limits (issue 12): config parsing, group selection, per-job metering flows, meter counters."""
from types import SimpleNamespace

import pytest
from os_ken.ofproto import ofproto_v1_3 as ofp, ofproto_v1_3_parser as parser

from lark.controller import config as ccfg
from lark.controller.flows import T_FORWARD
from lark.controller.model import JobReg
from lark.controller.ofapp import SwitchError
from lark.controller.registry import Registry
from lark.controller.wan import METER_BASE, LimitCounters, WanPlan, is_lark_meter
from lark.controller.wan_of import WanMeters
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
    assert [g.burst_kbit("wan0") for g in c.wan_groups] == [62500, 225000, 25000]   # 25% of the rate, in kbit


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
    c = LimitCounters()
    c.update(1, (0, 0), 1000, now=10.0)
    c.update(1, (0, 0), 1000 + 12_500_000, now=11.0)
    st = c.status(WanPlan(cfg().wan_groups), {(0, 0): 2})
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


# -- the OpenFlow side against a fake switch connection (real os-ken message classes) -------------------------


class FakeApp:
    """Records meter mods; answers meter config requests with `on_switch`; refuses meters in `refuse`."""

    def __init__(self, c, on_switch=None, refuse=()):
        self.cfg, self.registry = c, Registry(c)
        self._errors: dict = {}
        self.sent: list = []
        self.on_switch = dict(on_switch or {})    # meter id -> (rate kbps, burst kbit)
        self.refuse = set(refuse)
        self.xid = 0

    def _send(self, dp, msg):
        self.xid += 1
        self.sent.append(msg)
        if getattr(msg, "meter_id", None) in self.refuse:
            self._errors[(dp.id, self.xid)] = "OpenFlow error type 12 code 2"
        return self.xid

    def _request(self, dp, msg, timeout):
        if isinstance(msg, parser.OFPMeterStatsRequest):
            return [SimpleNamespace(body=getattr(self, "meter_stats", []))]
        if isinstance(msg, parser.OFPMeterConfigStatsRequest):
            body = [SimpleNamespace(meter_id=m, bands=[SimpleNamespace(rate=r, burst_size=b)])
                    for m, (r, b) in self.on_switch.items()]
            return [SimpleNamespace(body=body)]
        return []

    def mods(self):
        return [(m.command, m.meter_id, [(b.rate, b.burst_size) for b in m.bands]) for m in self.sent
                if isinstance(m, parser.OFPMeterMod)]


def switch():
    return SimpleNamespace(dp=SimpleNamespace(id=1, ofproto=ofp, ofproto_parser=parser))


def test_meter_made_once_before_flows_and_released_after_last_job():
    c = cfg()
    app = FakeApp(c)
    wm, sw = WanMeters(app, app.registry.wan), switch()
    e, _ = app.registry.register(job(1, group="cms"))
    wm.ensure(sw, app.registry.wan.limits_in(e.flows))
    wm.ensure(sw, app.registry.wan.limits_in(e.flows))
    assert app.mods() == [(ofp.OFPMC_ADD, METER_BASE, [(250_000, 62_500)])]
    wm.release(sw)
    assert len(app.mods()) == 1, "released a meter a registered job still needs"
    app.registry.unregister("ep1", "slot1")
    wm.release(sw)
    assert app.mods()[-1][:2] == (ofp.OFPMC_DELETE, METER_BASE)


def test_refused_meter_names_the_group():
    app = FakeApp(cfg(), refuse={METER_BASE + 2})
    with pytest.raises(SwitchError, match=r"0x4c02 \(group other\)"):
        WanMeters(app, app.registry.wan).ensure(switch(), {(2, 0)})


def test_switch_up_rerates_drops_orphans_and_leaves_unused_for_reconcile():
    c = cfg()
    app = FakeApp(c, on_switch={METER_BASE: (1000, 250),            # cms, wrong rate (config changed)
                                METER_BASE + 1: (900_000, 225_000),  # big: right rate, no job yet
                                METER_BASE + 9: (5, 1),              # a group no longer configured
                                7: (5, 1)})                          # the site's own meter
    app.registry.register(job(1, group="atlas"))                     # needs "other", missing
    wm, sw = WanMeters(app, app.registry.wan), switch()
    wm.switch_up(sw)
    assert sorted((cmd, m) for cmd, m, _ in app.mods()) == sorted([
        (ofp.OFPMC_MODIFY, METER_BASE), (ofp.OFPMC_DELETE, METER_BASE + 9), (ofp.OFPMC_ADD, METER_BASE + 2)])
    app.sent.clear()
    wm.release(sw)                         # a job leaving does not remove meters found at connect ...
    assert app.mods() == []
    wm.reconcile(sw)                       # ... reconciliation (after the grace period) does
    assert sorted(m for cmd, m, _ in app.mods()) == [METER_BASE, METER_BASE + 1]
    assert all(cmd == ofp.OFPMC_DELETE for cmd, _, _ in app.mods())


def test_a_groups_bytes_are_what_its_meter_let_through_not_what_it_was_offered():
    """A policed upload's dropped segments are sent again: counting the meter's offered bytes counted them twice."""
    app = FakeApp(cfg())
    band = parser.OFPMeterBandStats(packet_band_count=70, byte_band_count=100_000)
    app.meter_stats = [parser.OFPMeterStats(meter_id=METER_BASE, flow_count=1, packet_in_count=900,
                                            byte_in_count=1_000_000, duration_sec=1, duration_nsec=0,
                                            band_stats=[band]),
                       parser.OFPMeterStats(meter_id=7, flow_count=1, packet_in_count=1, byte_in_count=5,
                                            duration_sec=1, duration_nsec=0, band_stats=[])]   # not Lark's
    wm, sw = WanMeters(app, app.registry.wan), switch()
    wm.poll(sw)
    assert {limit: s.bytes for (_, limit), s in wm.counters.samples.items()} == {(0, 0): 900_000}


def test_status_prints_each_groups_rate_now_and_bytes(capsys):
    from lark.controller.cli import print_status
    st = {"totals": {"jobs": 2, "job_flows": 12, "base_flows": 9, "flows_per_switch": 21}, "rss_kib": 1,
          "switches": [], "jobs": [],
          "wan_groups": [{"group": "cms", "meter": METER_BASE, "rate_mbit": 250.0, "jobs": 2, "rate_now_mbit": 249.5,
                          "bytes": 123456789}]}
    print_status(st)
    line = [x for x in capsys.readouterr().out.splitlines() if x.startswith("cms")][0]
    assert line.split() == ["cms", "0x4c00", "250", "2", "249.50", "123456789"]


# -- per WAN port rates, steered jobs, the queue mechanism (pure plans; tc output as iproute2 6.1 prints it) ------

from lark.controller.flows import T_WAN  # noqa: E402
from lark.controller.wan import PORT_STRIDE, meter_id  # noqa: E402
from lark.controller.wan_queue import TcFilter, TcState, JobQueue, parse_classes, parse_filters, plan_port  # noqa: E402

PORTS = {"wan_ports": ["wan0", "wan1"], "site_prefixes": ["10.77.0.0/16"]}
STEER = [{"name": "cms-wan1", "kind": "wan_steer", "select": 'AcctGroup =?= "cms"', "port": "wan1"},
         {"name": "students", "kind": "wan_drop", "select": 'AcctGroup =?= "students"'}]
PER_PORT = [{**GROUPS[0], "port_rate": {"wan1": 100}}, GROUPS[2]]


def test_port_rate_overrides_the_groups_rate_on_that_port_only():
    c = ccfg.from_mapping({"switch": PORTS, "wan_group": PER_PORT})
    cms = c.wan_groups[0]
    assert (cms.rate_on("wan0"), cms.rate_on("wan1"), cms.rate_kbps("wan1"), cms.burst_kbit("wan1")) == \
        (250, 100, 100_000, 25_000)
    assert c.wan_mechanism == "meter" and c.wan_ovsdb == "unix:/var/run/openvswitch/db.sock"


def test_shipped_example_has_a_port_rate_and_loads_with_the_queue_mechanism():
    import tomllib
    data = tomllib.loads(open("policies/wan_groups.toml").read())
    assert data["wan_group"][0]["port_rate"] == {"wan1": 100}
    data["wan"]["mechanism"] = "queue"
    assert ccfg.from_mapping(data).wan_mechanism == "queue"


@pytest.mark.parametrize("groups,switch,wan,words", [
    ([{**GROUPS[0], "port_rate": {"wan9": 5}}], PORTS, {}, "not WAN ports"),
    ([{**GROUPS[0], "port_rate": {"wan1": 0}}], PORTS, {}, "port_rate"),
    ([{**GROUPS[0], "port_rate": 5}], PORTS, {}, "[wan_group.port_rate]"),
    (GROUPS, PORTS, {"mechanism": "police"}, 'mechanism = \'police\''),
    (GROUPS, PORTS, {"mechanism": "queue", "ovsdb": "/run/db.sock"}, "not an OVSDB remote"),
    (GROUPS, {"site_prefixes": ["10.77.0.0/16"]}, {"mechanism": "queue"}, "needs the WAN ports"),
    (GROUPS, {**PORTS, "wan_ports": [f"w{i}" for i in range(5)]}, {}, "at most 4 wan_ports"),
    (GROUPS, PORTS, {"queues": 3}, "unknown key wan.queues"),
])
def test_bad_mechanism_and_port_config_is_refused_clearly(groups, switch, wan, words):
    with pytest.raises(LarkError) as e:
        ccfg.from_mapping({"switch": switch, "wan_group": groups, "wan": wan})
    assert words in str(e.value)


def reg(c, group, n=1):
    return Registry(c).register(job(n, group=group))[0]


def test_steered_job_is_limited_on_its_port_in_table_2_and_a_dropped_one_gets_no_limit():
    c = ccfg.from_mapping({"switch": PORTS, "wan_group": PER_PORT, "policy": STEER})
    e = reg(c, "cms")
    limit = [f for f in e.flows if f.action[0].startswith("meter")]
    assert [(f.table, f.priority, f.action) for f in limit] == [(T_WAN, 250, ("meter_output", meter_id(0, 1),
                                                                              "wan1"))]
    assert meter_id(0, 1) == METER_BASE + PORT_STRIDE
    assert c.wan_groups and Registry(c).wan.limits_in(e.flows) == {(0, 1)}
    assert not [f for f in reg(c, "students").flows if f.action[0].startswith("meter")], "a wan_drop job got a meter"
    other = [f for f in reg(c, "atlas").flows if f.action[0].startswith("meter")]
    assert [(f.table, f.action) for f in other] == [(T_FORWARD, ("meter_normal", meter_id(1)))]
    dropping = ccfg.from_mapping({"switch": PORTS, "wan_group": PER_PORT[:1], "policy": STEER,
                                  "wan": {"unmatched": "drop"}})
    e = Registry(dropping).register(job(2, group="atlas"))[0]
    assert [f.action for f in e.flows if f.table == T_FORWARD and f.priority == 150] == [("drop",)]


def test_queue_mechanism_sends_set_queue_on_the_jobs_port():
    c = ccfg.from_mapping({"switch": PORTS, "wan_group": PER_PORT, "policy": STEER, "wan": {"mechanism": "queue"}})
    r = Registry(c)
    cms = r.register(job(1, group="cms", addrs=["10.77.1.1", "fd77::1"]))[0]
    assert {f.action for f in cms.flows if f.action[0].startswith("queue")} == {("queue_output", 1, "wan1")}
    other = r.register(job(2, group="atlas"))[0]
    assert [f.action for f in other.flows if f.action[0].startswith("queue")] == [("queue_normal", 2)]
    assert r.wan.limits_in(cms.flows + other.flows) == {(0, 1), (1, 0)}
    assert r.wan.describe((0, 1)) == "queue 1 (group cms on wan1)"
    assert sorted(filter(None, map(r.wan.sources, cms.flows))) == ["10.77.1.1", "fd77::1"]


CLASSES = """class htb 1:1 parent 1:fffe prio 0 rate 12Kbit ceil 10Gbit burst 1563b cburst 1250b
class htb 1:fffe root rate 10Gbit ceil 10Gbit burst 1250b cburst 1250b
class htb 1:2 parent 1:fffe prio 0 rate 20Mbit ceil 20Mbit burst 25000b cburst 1562b
class htb 1:f001 parent 1:2 prio 0 rate 8Kbit ceil 20Mbit burst 1600b cburst 25000b
"""
FILTERS = ('[{"protocol":"ip","pref":19456,"kind":"u32","chain":0},{"protocol":"ip","pref":19456,"kind":"u32",'
           '"chain":0,"options":{"fh":"800:","ht_divisor":1}},{"protocol":"ip","pref":19456,"kind":"u32","chain":0,'
           '"options":{"fh":"800::800","order":2048,"key_ht":"800","bkt":"0","flowid":"1:f001","not_in_hw":true,'
           '"match":{"value":"a4d0101","mask":"ffffffff","offmask":"","off":12}}},{"protocol":"ipv6","pref":19457,'
           '"kind":"u32","chain":0,"options":{"fh":"801::800","order":2048,"key_ht":"801","bkt":"0","flowid":'
           '"1:f001","not_in_hw":true,"match":{"value":"fd770000","mask":"ffffffff","offmask":"","off":8},"match":'
           '{"value":"0","mask":"ffffffff","offmask":"","off":12},"match":{"value":"0","mask":"ffffffff","offmask":'
           '"","off":16},"match":{"value":"1","mask":"ffffffff","offmask":"","off":20}}},{"protocol":"ip","pref":7,'
           '"kind":"u32","chain":0,"options":{"fh":"802::800","flowid":"1:1","match":{"value":"a4d0109","mask":'
           '"ffffffff","offmask":"","off":12}}}]')


def test_tc_output_is_read_back_into_larks_classes_and_filters():
    assert parse_classes(CLASSES) == {0xF001: 2}
    assert parse_filters(FILTERS) == [TcFilter(0x4C00, "ip", "800::800", 0xF001, "10.77.1.1"),
                                      TcFilter(0x4C01, "ipv6", "801::800", 0xF001, "fd77::1")]   # not the site's


def test_queue_plan_makes_a_class_and_filter_per_job_and_removes_only_what_it_owns():
    state = TcState(parse_classes(CLASSES), parse_filters(FILTERS))
    c1 = JobQueue(2, frozenset({"10.77.1.1", "fd77::1"}), 20)
    c2 = JobQueue(2, frozenset({"10.77.1.2"}), 20)
    owned: set[int] = set()
    # after a restart: c1's class is adopted (its filters carry exactly its addresses), c2 gets a new one
    cmds, leaves = plan_port("wan0", {11: c1, 12: c2}, state, {}, owned)
    assert leaves == {11: 0xF001, 12: 0xF002} and owned == {0xF001, 0xF002}
    assert cmds == [
        ["class", "add", "dev", "wan0", "parent", "1:2", "classid", "1:f002", "htb", "rate", "8kbit", "ceil", "20mbit",
         "cburst", "25000b", "quantum", "131072"],
        ["filter", "add", "dev", "wan0", "parent", "1:", "protocol", "ip", "prio", "19456", "u32", "match", "ip",
         "src", "10.77.1.2/32", "flowid", "1:f002"]]
    # nothing registered yet (controller just restarted): a class nobody claimed stays until reconciliation
    assert plan_port("wan0", {}, state, {}, set()) == ([], {})
    cmds, _ = plan_port("wan0", {}, state, {}, set(), everything=True)
    assert [c[:2] for c in cmds] == [["filter", "del"], ["filter", "del"], ["class", "del"]]
    assert cmds[-1] == ["class", "del", "dev", "wan0", "classid", "1:f001"]
    # c1 left while this process ran: its filters and class go at once
    owned = {0xF001}
    cmds, leaves = plan_port("wan0", {}, state, {11: 0xF001}, owned)
    assert [c[:2] for c in cmds] == [["filter", "del"], ["filter", "del"], ["class", "del"]] and owned == set()
    # a new job took c1's address before reconciliation: the stale filter goes, the address points to the new job
    c3 = JobQueue(3, frozenset({"10.77.1.1"}), 8)
    cmds, leaves = plan_port("wan0", {13: c3}, state, {}, set())
    assert leaves == {13: 0xF002}
    assert ["filter", "del", "dev", "wan0", "parent", "1:", "protocol", "ip", "prio", "19456", "handle", "800::800",
            "u32"] in cmds
    assert cmds[-1][-3:] == ["10.77.1.1/32", "flowid", "1:f002"]


def test_the_bounce_through_the_ifb_is_made_once_and_undone_without_touching_the_sites_filters():
    """A userspace datapath's queued packets hold its one AF_PACKET send buffer; Lark's WAN port egress goes
    through an ifb first (mirred sends a clone no socket owns). Both directions are safe to repeat, and a clsact
    that carries the site's own filters stays."""
    from lark.controller.wan_queue import BounceState, PREF_BOUNCE, bounce_name, parse_bounce, plan_bounce
    assert bounce_name("wan0") == "lq-wan0" and len(bounce_name("a-very-long-port-name")) == 15
    nothing = parse_bounce("qdisc noqueue 0: root refcnt 2\n", "", False)
    assert nothing == BounceState(False, False, False, False)
    ip, tc = plan_bounce("wan0", True, nothing)
    assert ip == [["link", "add", "lq-wan0", "type", "ifb"], ["link", "set", "lq-wan0", "up"]]
    assert tc == [["qdisc", "add", "dev", "wan0", "clsact"],
                  ["filter", "add", "dev", "wan0", "egress", "protocol", "all", "prio", str(PREF_BOUNCE), "u32",
                   "match", "u32", "0", "0", "action", "mirred", "egress", "redirect", "dev", "lq-wan0"]]
    assert plan_bounce("wan0", False, nothing) == ([], [])
    # as tc prints it: Lark's filter (a head entry and the rule), and on ingress one of the site's
    lark = ('[{"protocol":"all","pref":19458,"kind":"u32","chain":0},{"protocol":"all","pref":19458,"kind":"u32",'
            '"chain":0,"options":{"fh":"800::800","actions":[{"kind":"mirred"}]}}]')
    site = '[{"protocol":"ip","pref":1,"kind":"u32","chain":0}]'
    clsact = "qdisc noqueue 0: root refcnt 2\nqdisc clsact ffff: parent ffff:fff1\n"
    done = parse_bounce(clsact, lark + "\n[]\n", True)
    assert done == BounceState(True, True, True, False)
    assert plan_bounce("wan0", True, done) == ([], [])
    assert plan_bounce("wan0", False, done) == (
        [["link", "del", "lq-wan0"]],
        [["filter", "del", "dev", "wan0", "egress", "protocol", "all", "prio", str(PREF_BOUNCE)],
         ["qdisc", "del", "dev", "wan0", "clsact"]])
    shared = parse_bounce(clsact, lark + "\n" + site + "\n", True)
    assert shared.other_filters and plan_bounce("wan0", False, shared)[1] == [
        ["filter", "del", "dev", "wan0", "egress", "protocol", "all", "prio", str(PREF_BOUNCE)]]
    # the site's clsact without Lark's filter: only the filter is added
    assert plan_bounce("wan0", True, parse_bounce(clsact, site + "\n[]\n", True)) == (
        [], [tc[1]])


def test_tc_runs_in_the_named_netns_of_the_wan_ports_and_a_path_is_refused():
    from lark.controller import wan_queue
    from lark.controller.config import from_mapping
    from lark.errors import LarkError
    assert wan_queue.tc_argv("") == ["tc"] and wan_queue.tc_argv("core") == ["tc", "-netns", "core"]
    base = {"switch": {"wan_ports": ["wan0"], "site_prefixes": ["10.0.0.0/8"]}}
    with pytest.raises(LarkError, match="wan.tc_netns"):
        from_mapping({**base, "wan": {"tc_netns": "/run/netns/core"}}, base_dir="/")
    assert from_mapping({**base, "wan": {"tc_netns": "core"}}, base_dir="/").wan_tc_netns == "core"


def test_a_groups_new_rate_reaches_the_classes_of_its_jobs():
    """Group rates change with the config (the paper_wan bench goes 250 -> 900 Mbit/s for cms): an adopted job
    class under the group keeps its old ceil unless it is changed, and held the job at the old rate."""
    from lark.controller.wan_queue import parse_ceils
    state = TcState(parse_classes(CLASSES), parse_filters(FILTERS), parse_ceils(CLASSES))
    assert state.ceils == {0xF001: 20e6}
    same = plan_port("wan0", {11: JobQueue(2, frozenset({"10.77.1.1", "fd77::1"}), 20)}, state, {}, set())[0]
    assert not [c for c in same if c[:2] == ["class", "change"]]
    cmds, leaves = plan_port("wan0", {11: JobQueue(2, frozenset({"10.77.1.1", "fd77::1"}), 900)}, state, {}, set())
    assert leaves == {11: 0xF001}
    assert ["class", "change", "dev", "wan0", "parent", "1:2", "classid", "1:f001", "htb", "rate", "8kbit", "ceil",
            "900mbit", "cburst", "1125000b", "quantum", "131072"] in cmds


def test_a_wan_ports_device_is_looked_up_once_not_at_every_registration(monkeypatch):
    """classify runs at every registration (larkd waits for it in a job's setup); in another netns the lookup is a
    process, so a port found once is not looked up again."""
    from lark.controller import wan_queue
    looked = []
    monkeypatch.setattr(wan_queue, "device_exists", lambda dev, netns="": looked.append((dev, netns)) or True)
    q = object.__new__(wan_queue.WanQueues)
    q.db, q._present = object(), set()
    q.app = SimpleNamespace(cfg=SimpleNamespace(wan_tc_netns="core"))
    q.plan = SimpleNamespace(wan_ports=["wan0", "wan1"], port_name=lambda p: ["wan0", "wan1"][p])
    q._datapath = lambda p: "netdev"
    assert q._tc_ports() == [0, 1] and q._tc_ports() == [0, 1]
    assert looked == [("wan0", "core"), ("wan1", "core")]
    monkeypatch.setattr(wan_queue, "device_exists", lambda dev, netns="": False)
    q._present = set()
    with pytest.raises(LarkError, match="not in the network namespace core"):
        q._tc_ports()
