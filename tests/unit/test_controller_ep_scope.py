"""Issue 26, the registration API's side: what each EP may register ([ep.NAME]: its switch ports, its addresses, its
quota), the flows that bind a job to its EP's port, the status an EP sees, and the request checks. Each attack is
performed against the registry the API calls (the integration test does the same over TLS against the real
controller and switch)."""
import json
import re

import pytest

from lark.controller import config as ccfg
from lark.controller.flows import P_FOREIGN_PORT, T_SOURCE, decide, job_flows
from lark.controller.model import JobReg, OverQuota, Refused
from lark.controller.registry import Registry
from lark.controller.service import Controller
from lark.errors import LarkError

EPS = {"ep1": {"ports": ["ep1"], "addresses": ["10.77.0.100-10.77.0.149"]},
       "ep2": {"ports": ["ep2"], "addresses": ["10.77.0.150-10.77.0.199", "fd77::/64"], "max_jobs": 3}}
SLICES = [{"name": "slices", "kind": "slice", "select": "true"},
          {"name": "blocked", "kind": "drop", "select": 'Owner == "carol"'}]


def cfg(eps=EPS, **api):
    return ccfg.from_mapping({"switch": {"wan_ports": ["wan0"]}, "ep": eps, "policy": SLICES,
                              **({"api": api} if api else {})})


def job(ep, n, owner="alice", addr=None, mac=None):
    return JobReg.from_wire({"key": f"slot{n}", "job_id": f"{n}.0", "owner": owner,
                             "addresses": [addr or f"10.77.0.{n}"], "mac": mac or f"02:00:00:00:00:{n:02x}"}, ep)


def test_ranges_and_networks_are_parsed_and_checked():
    c = cfg()
    assert c.scope("ep1").holds("10.77.0.100") and c.scope("ep1").holds("10.77.0.149")
    assert not c.scope("ep1").holds("10.77.0.150") and c.scope("ep2").holds("fd77::5")
    assert c.scope("ep1").max_jobs == 4096 and c.scope("ep2").max_jobs == 3 and c.scope("ep3") is None
    assert cfg(max_jobs_per_ep=10).scope("ep1").max_jobs == 10


@pytest.mark.parametrize("eps, words", [
    ({"ep1": {"ports": ["ep1"], "addresses": ["10.77.0.0/24"]},
      "ep2": {"ports": ["ep2"], "addresses": ["10.77.0.128/25"]}}, "overlaps the addresses of EP 'ep1'"),
    ({"ep1": {"ports": ["p"], "addresses": ["10.1.0.0/24"]}, "ep2": {"ports": ["p"], "addresses": ["10.2.0.0/24"]}},
     "port 'p' is also ep1's"),
    ({"ep1": {"ports": ["wan0"], "addresses": ["10.1.0.0/24"]}}, "a WAN port"),
    ({"ep1": {"ports": [], "addresses": ["10.1.0.0/24"]}}, "not a non-empty list of switch port names"),
    ({"ep1": {"ports": ["ep1"], "addresses": ["10.1.0.9-nonsense"]}}, "is not a network or range"),
    ({"ep1": {"ports": ["ep1"], "addresses": ["10.1.0.0/24"], "max_jobs": -1}}, "max_jobs = -1"),
    ({"ep1": {"ports": ["ep1"]}}, "lacks ports/addresses"),
])
def test_bad_ep_sections_are_refused_with_the_fix(eps, words):
    with pytest.raises(LarkError) as e:
        cfg(eps)
    assert words in str(e.value) and "ep." in str(e.value)


def test_a_job_s_source_flows_match_its_ep_s_port_and_its_mac_elsewhere_is_dropped():
    c = cfg()
    j = job("ep1", 101)
    flows = job_flows(j, decide(j, c), c.scope("ep1").ports)
    source = [f for f in flows if f.table == T_SOURCE and ("eth_src", j.mac) in f.match]
    assert {dict(f.match).get("in_port") for f in source if f.priority != P_FOREIGN_PORT} == {"ep1"}
    assert [f.action for f in source if f.priority == P_FOREIGN_PORT] == [("drop",)]
    assert all(list(f.match) == sorted(f.match) for f in flows)
    # without a section (no [ep] at all): as before, no port in any flow
    assert not any("in_port" in dict(f.match) for f in job_flows(j, decide(j, c)))


def test_an_ep_cannot_register_another_ep_s_job_nor_its_addresses():
    r = Registry(cfg())
    victim = job("ep2", 150, owner="bob")
    r.register(victim)
    attacks = [job("ep1", 150, owner="bob"),                                    # ep2's address
               job("ep1", 101, owner="bob", mac=victim.mac),                     # ep2's job's MAC, own address
               job("ep1", 7, owner="bob")]                                       # nobody's, outside ep1's range
    for forged in attacks:
        with pytest.raises(Refused) as e:
            r.register(forged)
        assert e.value.status == 403 and "registration from ep1" in str(e.value)
    with pytest.raises(Refused, match=re.escape("belongs to job 150.0 of EP ep2")):
        r.register(attacks[1])
    with pytest.raises(Refused, match=re.escape("no [ep.NAME] section")):
        r.register(job("intruder", 120))
    # nothing of ep2's job changed, and a resync from ep1 naming its address is refused as a whole
    (e2,) = r.entries()
    assert e2.job == victim
    with pytest.raises(Refused):
        r.sync("ep1", [job("ep1", 101), job("ep1", 150)])
    assert [e.job.ep for e in r.entries()] == ["ep2"]


def test_a_blocked_owner_is_not_unblocked_by_another_ep():
    """Today's attack: ep1 registers a job with the MAC of ep2's blocked job (same drop flows, so they replace
    ep2's on the switch under ep1's cookie), then removes it: the switch deletes the flows by ep1's cookie."""
    r = Registry(cfg())
    r.register(job("ep2", 160, owner="carol"))
    with pytest.raises(Refused):
        r.register(job("ep1", 110, owner="carol", mac="02:00:00:00:00:a0"))
    assert r.entries()[0].decision.blocked_by == "blocked"


def test_an_ep_s_own_jobs_replace_each_other_and_gone_jobs_free_their_addresses():
    r = Registry(ccfg.from_mapping({}))           # no [ep] sections: any EP, any address, but never another's
    r.register(job("ep1", 1))
    r.register(job("ep1", 2, addr="10.77.0.1", mac="02:00:00:00:00:01"))   # its next job in another slot: fine
    r.unregister("ep1", "slot1")
    with pytest.raises(Refused):                   # job 2 still holds them
        r.register(job("ep2", 3, addr="10.77.0.1"))
    r.sync("ep1", [])
    r.register(job("ep2", 3, addr="10.77.0.1", mac="02:00:00:00:00:01"))
    assert [(e.job.ep, e.job.job_id) for e in r.entries()] == [("ep2", "3.0")]


def test_the_quota_refuses_jobs_beyond_it_and_counts_removals():
    r = Registry(cfg())
    for n in (150, 151, 152):
        r.register(job("ep2", n))
    with pytest.raises(OverQuota) as e:
        r.register(job("ep2", 153))
    assert e.value.status == 429 and "quota" in str(e.value) and "max_jobs" in str(e.value)
    r.register(job("ep2", 152, owner="bob"))          # re-registering a job it has is not a new one
    r.unregister("ep2", "slot150")
    r.register(job("ep2", 153))
    with pytest.raises(OverQuota):
        r.sync("ep2", [job("ep2", n) for n in range(160, 164)])
    assert len([e for e in r.entries() if e.job.ep == "ep2"]) == 3


def test_unlisted_eps_keep_today_s_trust_but_not_another_ep_s_addresses():
    r = Registry(ccfg.from_mapping({"api": {"max_jobs_per_ep": 2}}))
    r.register(job("ep1", 1))
    with pytest.raises(Refused, match=re.escape("belongs to job 1.0 of EP ep1")):
        r.register(job("ep2", 2, addr="10.77.0.1"))
    r.register(job("ep1", 2))
    with pytest.raises(OverQuota):
        r.register(job("ep1", 3))


def test_an_ep_sees_only_its_own_jobs_in_the_status():
    c = cfg()
    r = Registry(c)
    r.register(job("ep1", 101, owner="alice"))
    r.register(job("ep2", 150, owner="bob"))
    ctl = Controller(c, r)
    mine = ctl.status("ep1")
    assert [j["owner"] for j in mine["jobs"]] == ["alice"] and mine["totals"]["jobs"] == 1
    assert "bob" not in json.dumps(mine) and "switches" not in mine and "wan_groups" not in mine
    assert {j["owner"] for j in ctl.status()["jobs"]} == {"alice", "bob"}


@pytest.mark.parametrize("field, value", [
    ("vlan", True), ("request_bandwidth_mbit", float("nan")), ("request_bandwidth_mbit", float("inf")),
    ("request_bandwidth_mbit", True), ("addresses", [167772161]), ("mac", 2), ("attrs", {"X": float("nan")}),
    ("key", 5), ("owner", ["alice"]),
])
def test_wrong_types_are_refused_with_the_field(field, value):
    wire = {"key": "s", "job_id": "1.0", "addresses": ["10.77.0.1"], "mac": "02:00:00:00:00:01", field: value}
    with pytest.raises(LarkError) as e:
        JobReg.from_wire(wire, "ep1")
    assert field in str(e.value) and "registration from ep1" in str(e.value)
