"""A submitter's own transfer plugin (TransferPlugins) is refused on the execution point (lark/policy/transfers.py),
and the shipped configuration runs that refusal before the starter's input transfer (issue 22)."""
from __future__ import annotations

import pytest
from test_access_point_config import REPO, knobs, true_for

from lark.config import Config
from lark.errors import LarkError
from lark.policy.classads import parse_ad
from lark.policy.engine import decide
from lark.policy.transfers import check_transfer_plugins, own_plugins

JOB = '[ClusterId = 7; ProcId = 0; Owner = "alice"; {extra}]'


def ad(extra: str = ""):
    return parse_ad(JOB.format(extra=extra), "job")


@pytest.mark.parametrize("extra, expected", [
    ("", None),
    ("TransferPlugins = undefined", None),
    ('TransferPlugins = ""', None),
    ('TransferPlugins = "  "', None),
    ('TransferInput = "http://example.org/x"', None),          # the pool's plugins: fine
    ('TransferPlugins = "evil=evil.sh"', "evil=evil.sh"),
    ('TransferPlugins = "a,b=x.sh; c=y.py"', "a,b=x.sh; c=y.py"),
    ('TransferPlugins = strcat("evil=", "e.sh")', "evil=e.sh"),  # evaluated, as the starter reads it
    ('TransferPlugins = 1/"x"', "<error>"),                      # unreadable: refused, not guessed at
])
def test_own_plugins_is_what_the_starter_would_run(extra, expected):
    assert own_plugins(ad(extra)) == expected


def test_the_refusal_names_the_job_the_attribute_and_the_fix():
    with pytest.raises(LarkError) as e:
        check_transfer_plugins(ad('TransferPlugins = "evil=evil.sh"'), "7.0")
    text = str(e.value)
    assert text.startswith("job 7.0: TransferPlugins = evil=evil.sh: ")
    assert "execution point's network" in text and "remove transfer_plugins" in text
    check_transfer_plugins(ad(), "7.0")  # no plugin: nothing raised


def test_the_policy_refuses_such_a_job_whatever_the_machine_says():
    machine = parse_ad('[NetworkType = "nat"]', "machine")
    cfg = Config(bandwidth_mbit=1000)
    assert decide(ad(), machine, cfg, "slot1", "slot1").network_type == "nat"
    with pytest.raises(LarkError, match="own transfer plugin"):
        decide(ad('TransferPlugins = "evil=evil.sh"'), machine, cfg, "slot1", "slot1")


def test_the_execution_point_never_matches_such_a_job_and_htcondor_refuses_the_plugin(tmp_path):
    import classad2
    k = knobs(tmp_path, "START", "STARTER_DISABLE_USER_SUPPLIED_TRANSFER_PLUGINS",
              fragment=REPO / "condor_config.d" / "50-lark.conf")
    start = classad2.ExprTree(k["START"])
    machine = classad2.ClassAd()
    assert start.eval(machine, classad2.ClassAd({"Owner": "alice"})) is True
    assert start.eval(machine, classad2.ClassAd({"TransferPlugins": ""})) is True
    assert start.eval(machine, classad2.ClassAd({"TransferPlugins": "evil=evil.sh"})) is False
    assert k["STARTER_DISABLE_USER_SUPPLIED_TRANSFER_PLUGINS"].lower() == "true"


def test_the_access_point_protects_transfer_plugins_from_condor_qedit(tmp_path):
    k = knobs(tmp_path, "PROTECTED_JOB_ATTRS", "SUBMIT_REQUIREMENT_LarkOwnPlugins")
    assert "TransferPlugins" in k["PROTECTED_JOB_ATTRS"].replace(",", " ").split()
    assert not true_for(k["SUBMIT_REQUIREMENT_LarkOwnPlugins"], TransferPlugins="evil=evil.sh")


# -- `lark doctor` (plugins line), with a fake condor_config_val ----------------------------------------------------
def fake_config(**knobs_set: str):
    def run(argv: list[str]) -> tuple[int, str]:
        assert argv[0] == "condor_config_val"
        value = knobs_set.get(argv[1])
        return (0, value + "\n") if value is not None else (1, "")
    return run


def test_doctor_names_an_ep_that_would_run_a_jobs_own_plugin():
    from lark import hostcheck
    bare = hostcheck.own_plugins(fake_config(START="true"))
    assert not bare.ok and "STARTER_DISABLE_USER_SUPPLIED_TRANSFER_PLUGINS = true" in bare.fix
    assert "LARK_START_NO_OWN_PLUGINS" in bare.fix
    text, to_fix = hostcheck.report([bare])
    assert to_fix == 1 and "plugins    ACTION" in text
    shipped = hostcheck.own_plugins(fake_config(
        START='(true) && (TARGET.TransferPlugins =?= undefined || TARGET.TransferPlugins =?= "")',
        STARTER_DISABLE_USER_SUPPLIED_TRANSFER_PLUGINS="true"))
    assert shipped.ok and "never matched to this EP" in shipped.action
    knob_only = hostcheck.own_plugins(fake_config(STARTER_DISABLE_USER_SUPPLIED_TRANSFER_PLUGINS="True"))
    assert knob_only.ok and "the starter refuses it" in knob_only.action
