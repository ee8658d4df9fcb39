"""The access point's shipped policy (condor_config.d/55-lark-access-point.conf), read by HTCondor's own
configuration code and evaluated by its ClassAd engine: which holds Lark releases by itself, and when it stops."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
FRAGMENT = REPO / "condor_config.d" / "55-lark-access-point.conf"
NOW = 1_800_000_000


def knobs(tmp_path: Path, *names: str, fragment: Path = FRAGMENT) -> dict[str, str]:
    """The knobs as HTCondor reads them with the fragment installed (macros expanded), in a fresh process."""
    pytest.importorskip("htcondor2")
    conf = tmp_path / "condor_config_knobs"
    conf.write_text(f"include : {fragment}\n")
    code = ("import json, sys, htcondor2; "
            "print(json.dumps({n: htcondor2.param.get(n) for n in sys.argv[1:]}))")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("_CONDOR_", "CONDOR_"))}
    cp = subprocess.run([sys.executable, "-c", code, *names], capture_output=True, text=True, timeout=60,
                        env={**env, "CONDOR_CONFIG": str(conf)})
    assert cp.returncode == 0, cp.stderr
    return json.loads(cp.stdout)


def true_for(expr: str, **job) -> bool:
    import classad2
    ad = classad2.ClassAd({"EnteredCurrentStatus": NOW - 120, **job})
    value = classad2.ExprTree(expr.replace("time()", str(NOW))).eval(ad)
    return value is True


def held(sub: int, lark_holds: int | None) -> dict:
    job = {"HoldReasonCode": 19, "HoldReasonSubCode": sub}
    if lark_holds is not None:
        job["NumHoldsByReason"] = classad_of(HookPrepareJobFailure=lark_holds)
    return job


def classad_of(**attrs):
    import classad2
    return classad2.ClassAd(attrs)


def test_larkd_down_holds_are_released_until_the_cap_and_policy_refusals_never(tmp_path):
    k = knobs(tmp_path, "SYSTEM_PERIODIC_RELEASE_NAMES", "SYSTEM_PERIODIC_RELEASE_LarkTransient")
    assert "LarkTransient" in k["SYSTEM_PERIODIC_RELEASE_NAMES"].split()
    expr = k["SYSTEM_PERIODIC_RELEASE_LarkTransient"]
    assert true_for(expr, **held(111, None))          # the first hold: NumHoldsByReason is not there yet
    assert true_for(expr, **held(111, 5))             # up to LARK_RELEASE_MAX
    assert not true_for(expr, **held(111, 6))         # past it: stays held for the admin
    assert not true_for(expr, **held(112, 1))         # a policy refusal is permanent
    assert not true_for(expr, HoldReasonCode=1, HoldReasonSubCode=0)   # a user's own hold
    assert not true_for(expr, **held(111, 1), EnteredCurrentStatus=NOW - 10)   # not before LARK_RELEASE_AFTER


def test_a_submitters_own_transfer_plugin_is_refused_and_the_pools_plugins_are_not(tmp_path):
    k = knobs(tmp_path, "SUBMIT_REQUIREMENT_NAMES", "SUBMIT_REQUIREMENT_LarkOwnPlugins",
              "SUBMIT_REQUIREMENT_LarkOwnPlugins_REASON")
    assert "LarkOwnPlugins" in k["SUBMIT_REQUIREMENT_NAMES"].split()
    expr = k["SUBMIT_REQUIREMENT_LarkOwnPlugins"]
    assert true_for(expr)                                            # no transfer_plugins (URL inputs are fine)
    assert true_for(expr, TransferInput="http://example.org/x")
    assert not true_for(expr, TransferPlugins="evil=evil.sh")
    assert "transfer_plugins" in k["SUBMIT_REQUIREMENT_LarkOwnPlugins_REASON"]


# -- who may claim which accounting group (condor_config.d/56-lark-acct-groups.conf, issue 23 item 17) -------------
ACCT_FRAGMENT = REPO / "condor_config.d" / "56-lark-acct-groups.conf"
EXAMPLE_MAP = REPO / "policies" / "acct_groups.map"
# Run in a fresh process with HTCondor's configuration: its user-map code loads the maps the schedd would
# (TOOL_ is this process's subsystem), and each job ad goes through every submit requirement as the schedd's would.
_SCHEDD = """
import json, sys, htcondor2, classad2
want = json.loads(sys.stdin.read())
names = htcondor2.param["SUBMIT_REQUIREMENT_NAMES"].split()
out = {"jobs": [], "groups": {}}
for job in want["jobs"]:
    ad, refused = classad2.ClassAd(job), {}
    for name in names:
        if classad2.ExprTree(htcondor2.param["SUBMIT_REQUIREMENT_" + name]).eval(ad) is not True:
            refused[name] = classad2.ExprTree(htcondor2.param["SUBMIT_REQUIREMENT_" + name + "_REASON"]).eval(ad)
    out["jobs"].append(refused)
for user in want["users"]:
    groups = classad2.ExprTree('userMap("LarkAcctGroups", "%s")' % user).eval()
    out["groups"][user] = groups if isinstance(groups, str) else None
print(json.dumps(out))
"""


def submitted(owner: str, group: str | None = None, group_user: str | None = None, **attrs) -> dict:
    """The job ad's accounting attributes as condor_submit 25.x writes them (`condor_submit -dump`), plus attrs."""
    ad: dict = {"Owner": owner}
    if group:
        ad.update(AcctGroup=group, AcctGroupUser=group_user or owner, AccountingGroup=f"{group}.{group_user or owner}")
    elif group_user:
        ad.update(AcctGroupUser=group_user, AccountingGroup=group_user)
    return {**ad, **attrs}


def at_schedd(tmp_path: Path, jobs: list[dict], map_file: Path | None = None, map_first: bool = False,
              users: tuple[str, ...] = ()) -> tuple[list[dict], dict]:
    """What the schedd would say to each job at submit ({requirement: reason} for each refusal), with the fragment
    installed and LARK_ACCT_GROUP_MAP naming map_file (in a file read before the fragment when map_first); and the
    groups the map gives each of `users`."""
    pytest.importorskip("htcondor2")
    conf = tmp_path / "condor_config"
    lines = [f"include : {ACCT_FRAGMENT}", "TOOL_CLASSAD_USER_MAP_NAMES = $(SCHEDD_CLASSAD_USER_MAP_NAMES)"]
    if map_file is not None:
        lines.insert(0 if map_first else 1, f"LARK_ACCT_GROUP_MAP = {map_file}")
    conf.write_text("\n".join(lines) + "\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("_CONDOR_", "CONDOR_"))}
    cp = subprocess.run([sys.executable, "-c", _SCHEDD], input=json.dumps({"jobs": jobs, "users": list(users)}),
                        capture_output=True, text=True, timeout=60, env={**env, "CONDOR_CONFIG": str(conf)})
    assert cp.returncode == 0, cp.stderr
    out = json.loads(cp.stdout)
    return out["jobs"], out["groups"]


def test_without_a_map_any_group_is_accepted_and_the_groups_are_protected_after_submit(tmp_path):
    verdicts, _ = at_schedd(tmp_path, [submitted("bob", "cms"), submitted("bob", AccountingGroup="cms.bob"),
                                       submitted("bob", "cms", group_user="alice")])
    assert verdicts == [{}, {}, {}]
    k = knobs(tmp_path, "PROTECTED_JOB_ATTRS", "SCHEDD_CLASSAD_USER_MAP_NAMES", fragment=ACCT_FRAGMENT)
    assert {"AcctGroup", "AcctGroupUser", "AccountingGroup"} <= set(k["PROTECTED_JOB_ATTRS"].split())
    assert "LarkAcctGroups" in k["SCHEDD_CLASSAD_USER_MAP_NAMES"].split()


@pytest.mark.parametrize("map_first", [False, True], ids=["map-named-after", "map-named-before"])
def test_a_group_its_owner_is_not_mapped_to_is_refused_with_user_group_and_map(tmp_path, map_first):
    jobs = [submitted("bob", "cms"), submitted("carol", "students"), submitted("alice", "cms.production"),
            submitted("alice", "cms"), submitted("alice", "students"), submitted("alice"), submitted("bob")]
    verdicts, _ = at_schedd(tmp_path, jobs, EXAMPLE_MAP, map_first)
    assert [bool(v) for v in verdicts] == [True, True, True, False, False, False, False]
    reason = verdicts[0]["LarkAcctGroup"]
    assert "bob" in reason and "accounting group cms" in reason and str(EXAMPLE_MAP) in reason, reason
    assert "alice" in verdicts[2]["LarkAcctGroup"] and "cms,students" in verdicts[2]["LarkAcctGroup"]


def test_accounting_group_and_its_user_cannot_be_claimed_around_the_check(tmp_path):
    jobs = [submitted("bob", AccountingGroup="cms.bob"),         # the group Lark falls back on, no AcctGroup
            submitted("bob", AcctGroup="cms"),                    # +AcctGroup without condor_submit's others
            submitted("bob", group_user="alice"),                 # alice's fair-share, bob's job
            submitted("alice", "students", AccountingGroup="cms.alice"),
            submitted("alice", group_user="alice")]              # accounting_group_user = own name: fine
    verdicts, _ = at_schedd(tmp_path, jobs, EXAMPLE_MAP)
    assert [sorted(v) for v in verdicts] == [["LarkAcctGroupDerived"], ["LarkAcctGroup"], ["LarkAcctGroupDerived"],
                                             ["LarkAcctGroupDerived"], []]
    reason = verdicts[0]["LarkAcctGroupDerived"]
    assert "bob" in reason and "cms.bob" in reason and str(EXAMPLE_MAP) in reason, reason


def test_a_map_that_cannot_be_read_refuses_every_group_and_no_group_still_runs(tmp_path):
    missing = tmp_path / "no-such.map"
    verdicts, groups = at_schedd(tmp_path, [submitted("alice", "cms"), submitted("alice")], missing, users=("alice",))
    assert groups == {"alice": None}
    assert "no group" in verdicts[0]["LarkAcctGroup"] and str(missing) in verdicts[0]["LarkAcctGroup"]
    assert verdicts[1] == {}


def test_the_pool_testbeds_map_allows_exactly_the_groups_its_jobs_use(tmp_path):
    sys.path.insert(0, str(REPO / "testbed"))
    import importlib.util

    import pool
    import pool_probe
    spec = importlib.util.spec_from_file_location("paper_wan", REPO / "bench" / "paper_wan.py")
    bench = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = bench
    spec.loader.exec_module(bench)
    used: dict[str, set[str]] = {user: set() for user in pool.USERS}
    ads = []
    for user, sub in [*((j.user, j.extra) for j in pool_probe.policy_jobs()),
                      *((j.user, bench.submit_file(j, pool, "reno")) for j in bench.make_jobs())]:
        lines = dict(line.replace(" ", "").split("=", 1) for line in sub.splitlines() if "=" in line)
        ads.append(submitted(user, lines.get("accounting_group"), lines.get("accounting_group_user")))
        used[user] |= {lines["accounting_group"]} if "accounting_group" in lines else set()
    assert pool.ACCT_GROUP_MAP == EXAMPLE_MAP and pool.ACCT_GROUP_MAP_PATH in pool.condor_config("cm")
    verdicts, groups = at_schedd(tmp_path, ads, EXAMPLE_MAP, users=tuple(pool.USERS))
    assert verdicts == [{}] * len(ads)
    assert {u: set((g or "").split(",")) - {""} for u, g in groups.items()} == used == {
        "alice": {"cms", "students"}, "bob": set(), "carol": set()}


def test_the_one_machine_testbeds_map_lets_alice_claim_cms_and_not_bob(tmp_path):
    sys.path.insert(0, str(REPO / "testbed"))
    import testbed
    mapped = tmp_path / "testbed.map"
    mapped.write_text(testbed.ACCT_GROUP_MAP)
    verdicts, _ = at_schedd(tmp_path, [submitted("alice", "cms"), submitted("bob", "cms")], mapped)
    assert [bool(v) for v in verdicts] == [False, True]



def test_every_attribute_larkd_pushes_is_protected_and_refused_at_submit(tmp_path):
    """The attack: a submitter presets a figure (NetworkInputMb = 0, say) and its job kills its wrapper, so no exit
    barrier overwrites it: a job shorter than the first periodic push would keep the preset in its history and in
    every dashboard that reads HTCondor's own attributes. Every attribute larkd writes (a push with every field
    filled) must be protected after submit and refused at submit, each one alone."""
    from lark.daemon.adpush import job_attributes
    pushed = job_attributes({"usage": {"bytes_in": 1, "bytes_out": 1, "packets_in": 1, "packets_out": 1,
                                       "avg_in_bps": 1.0, "avg_out_bps": 1.0, "peak_in_bps": 1.0, "peak_out_bps": 1.0},
                             "plan": {"network_type": "nat", "ipv4": "10.0.0.2", "ipv6": "fd00::2",
                                      "inbound_port": 20000, "rate_limit_mbit": 10}})
    k = knobs(tmp_path, "PROTECTED_JOB_ATTRS", "SUBMIT_REQUIREMENT_LarkFigures")
    assert true_for(k["SUBMIT_REQUIREMENT_LarkFigures"])
    assert {"NetworkInputMb", "NetworkOutputMb", "LarkFiguresBy"} <= set(pushed)
    for attr in pushed:
        assert attr in k["PROTECTED_JOB_ATTRS"].split(), f"{attr} is not protected"
        assert not true_for(k["SUBMIT_REQUIREMENT_LarkFigures"], **{attr: 0}), f"a preset {attr} is accepted"
