"""The label scheme's pure parts (lark.controller.labels, the registry in `[labels] mode = "vlan"`): the core's flows
grow with EPs and WAN actions, not jobs; labels follow the policies; only a drop naming a job gets per-job flows."""
import ipaddress

import pytest

from lark.controller import labels
from lark.controller.config import from_mapping
from lark.controller.model import JobReg
from lark.controller.registry import Registry
from lark.errors import LarkError

POLICIES = [
    {"name": "blocked", "kind": "drop", "select": 'Owner == "mallory"'},
    {"name": "one-job", "kind": "drop", "select": 'LarkJobId == "7.0"'},
    {"name": "slices", "kind": "slice", "select": "true"},
    {"name": "no-wan", "kind": "wan_drop", "select": 'AcctGroup =?= "students"'},
    {"name": "via-wan1", "kind": "wan_steer", "select": 'AcctGroup =?= "cms"', "port": "wan1"},
]


def config(eps: int, mode: str = "vlan"):
    return from_mapping({
        "switch": {"wan_ports": ["wan0", "wan1"], "site_prefixes": ["10.0.0.0/8"]},
        "labels": {"mode": mode}, "policy": POLICIES,
        "ep": {f"ep{e}": {"ports": [f"p{e}"], "addresses": [str(ipaddress.IPv4Network((0x0A800000 + e * 4096, 20)))]}
               for e in range(eps)}})


def reg(ep: int, j: int, owner: str, group: str = "", job_id: str = "") -> JobReg:
    return JobReg(ep=f"ep{ep}", key=f"slot{j}", job_id=job_id or f"{ep}.{j}", owner=owner, accounting_group=group,
                  addresses=[str(ipaddress.IPv4Address(0x0A800000 + ep * 4096 + j))],
                  mac=f"02:7a:00:{ep:02x}:00:{j:02x}")


def test_core_flows_grow_by_two_per_ep_and_not_with_jobs():
    flows = labels.core_flows(config(1000))
    per_ep = [f for f in flows if dict(f.match).get("in_port")]
    assert len(per_ep) == 2000 and len({dict(f.match)["in_port"] for f in per_ep}) == 1000
    # the rest: per WAN action in use (none, drop, steer) and per job network (the EPs' ranges, collapsed)
    assert len(flows) - len(per_ep) < 100


def test_labels_follow_the_policies_and_only_a_job_named_by_a_drop_gets_core_entries():
    r = Registry(config(4))
    alice1, _ = r.register(reg(0, 1, "alice"))
    alice2, _ = r.register(reg(3, 2, "alice", "cms"))
    bob, _ = r.register(reg(0, 3, "bob", "students"))
    mallory, _ = r.register(reg(1, 4, "mallory"))
    named, _ = r.register(reg(2, 5, "carol", job_id="7.0"))
    assert alice1.label[0] == alice2.label[0] and alice1.label[0] != bob.label[0]
    assert labels.FIRST_SLICE_VID <= alice1.label[0] <= labels.LAST_SLICE_VID
    assert (alice1.label[1], alice2.label[1], bob.label[1]) == (0, 3, 1)   # none, steer out wan_ports[1], drop
    assert mallory.label == named.label == (labels.BLOCKED_VID, 0)
    assert [len(e.flows) for e in (alice1, alice2, bob, mallory)] == [0, 0, 0, 0]
    assert len(named.flows) == 2 and {f.match for f in named.flows} == {(("eth_src", named.job.mac),),
                                                                         (("eth_dst", named.job.mac),)}
    # the per-job scheme, same jobs: flows of their own
    per_job = Registry(config(4, "off")).register(reg(0, 1, "alice"))[0]
    assert len(per_job.flows) == 6 and per_job.label is None


def test_a_policy_singles_out_jobs_only_when_it_names_a_job_identity():
    cfg = config(1)
    assert [labels.singles_out(p) for p in cfg.policies] == [False, True, False, False, False]


def test_label_mode_needs_ep_sections_and_a_known_mode():
    with pytest.raises(LarkError, match=r"\[ep\.NAME\]"):
        from_mapping({"labels": {"mode": "vlan"}})
    with pytest.raises(LarkError, match="not a label scheme"):
        from_mapping({"labels": {"mode": "mpls"}})
