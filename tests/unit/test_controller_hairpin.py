"""Jobs on the same EP (lark.controller.hairpin): which flows send an isolated EP's frames back out its port."""
import pytest

from lark.config import Config
from lark.controller import config as ccfg
from lark.controller import hairpin
from lark.controller.flows import T_FORWARD, decide, job_flows
from lark.controller.model import JobReg
from lark.controller.registry import Registry
from lark.errors import LarkError

SWITCH = {"wan_ports": ["wan0", "wan1"], "site_prefixes": ["10.77.0.0/16"]}
POLICIES = [{"name": "blocked", "kind": "drop", "select": 'Owner == "carol"'},
            {"name": "slices", "kind": "slice", "select": "true"}]


def cfg(ep_ports=None):
    switch = {**SWITCH, **({"ep_ports": ep_ports} if ep_ports is not None else {})}
    return ccfg.from_mapping({"switch": switch, "policy": POLICIES})


def job(n, owner, ep):
    return JobReg.from_wire({"key": f"slot{n}", "job_id": f"{n}.0", "owner": owner, "addresses": [f"10.77.1.{n}"],
                             "mac": f"02:00:00:00:00:{n:02x}"}, ep)


def test_a_job_on_a_listed_ep_gets_one_flow_back_out_its_eps_port():
    c = cfg({"ep1": "port-a", "ep2": "port-b"})
    flows = hairpin.job_flows(job(1, "alice", "ep2"), c)
    assert len(flows) == 1
    f = flows[0]
    assert (f.table, f.action) == (T_FORWARD, ("in_port",))
    assert dict(f.match) == {"eth_dst": "02:00:00:00:00:01", "in_port": "port-b"}
    # above the WAN-meter flows of table 3 (site 160, per job 150): same-EP traffic is never metered
    assert f.priority > 160
    # an EP the admin did not list (not isolated, or its port unknown) gets no hairpin flow
    assert hairpin.job_flows(job(2, "alice", "ep3"), c) == []


def test_broadcast_and_multicast_from_each_ep_port_go_back_to_it_and_on():
    c = cfg({"ep1": "port-a", "ep2": "port-b"})
    base = hairpin.base_flows(c)
    assert [dict(f.match)["in_port"] for f in base] == ["port-a", "port-b"]
    for f in base:
        assert f.table == T_FORWARD and f.action == ("in_port_normal",)
        value, mask = dict(f.match)["eth_dst"]
        assert int(mask.replace(":", ""), 16) == 1 << 40 and int(value.replace(":", ""), 16) == 1 << 40  # group bit
    assert hairpin.base_flows(cfg()) == []


def test_registry_adds_the_hairpin_flow_except_for_a_blocked_job_and_keeps_the_count_constant():
    c = cfg({"ep1": "ep1"})
    reg = Registry(c)
    counts = {}
    for n, owner, ep in ((1, "alice", "ep1"), (2, "bob", "ep1"), (3, "carol", "ep1"), (4, "alice", "ep2")):
        entry, _ = reg.register(job(n, owner, ep))
        counts[f"{owner}@{ep}"] = len(entry.flows)
        hair = [f for f in entry.flows if f.action == ("in_port",)]
        assert len(hair) == (1 if ep == "ep1" and owner != "carol" else 0), (owner, ep, entry.flows)
    # sliced job with one IPv4 address: 5 + 1 on an isolated EP; blocked: 2 (table 0 drops to and from its MAC)
    assert counts == {"alice@ep1": 6, "bob@ep1": 6, "carol@ep1": 2, "alice@ep2": 5}
    # the per-job flows without the hairpin are exactly the ones the policies compile (nothing else changed)
    j = job(5, "alice", "ep1")
    assert reg.register(j)[0].flows[:-1] == job_flows(j, decide(j, c))


@pytest.mark.parametrize("ep_ports, words", [
    (["ep1"], "not a table of EP names to port names"),
    ({"ep1": 3}, "not a table of EP names to port names"),
    ({"ep1": "p1", "ep2": "p1"}, "names a port twice"),
    ({"ep1": "wan0"}, "names a port twice or a WAN port"),
])
def test_bad_ep_ports_are_refused_with_the_fix(ep_ports, words):
    with pytest.raises(LarkError) as e:
        cfg(ep_ports)
    assert words in str(e.value) and "ep_ports" in str(e.value)


def test_larkd_knob_is_checked():
    assert Config(bridge_isolate_jobs=True, bridge_uplink="eth0").validate().bridge_isolate_jobs is True
    with pytest.raises(LarkError) as e:
        Config(bridge_isolate_jobs="yes").validate()
    assert "bridge_isolate_jobs" in str(e.value)
    with pytest.raises(LarkError) as e:   # isolated jobs meet only through the uplink: it must be named
        Config(bridge_isolate_jobs=True).validate()
    assert "bridge_uplink" in str(e.value) and "eth0" in str(e.value)
