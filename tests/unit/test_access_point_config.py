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


def knobs(tmp_path: Path, *names: str) -> dict[str, str]:
    """The knobs as HTCondor reads them with the fragment installed (macros expanded), in a fresh process."""
    pytest.importorskip("htcondor2")
    conf = tmp_path / "condor_config"
    conf.write_text(f"include : {FRAGMENT}\n")
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
