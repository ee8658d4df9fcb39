"""Accounting groups cannot be claimed (issue 23 item 17): the testbed's access point maps users to the groups they
may use (testbed.ACCT_GROUP_MAP through condor_config.d/56-lark-acct-groups.conf). bob, not mapped to cms, is
refused at submit with the reason and cannot edit cms into a queued job; alice's cms job is accepted and runs."""
import secrets

import pytest

from condor import as_root, as_user, history, job, queue_attrs, starts, submit, submit_script, testbed

pytestmark = pytest.mark.e2e


def test_bob_cannot_claim_cms_and_alices_cms_job_runs(pool):
    tag = secrets.token_hex(2)

    # The attack: bob names alice's group in his submit file. The schedd refuses it, saying who, what and where.
    claim = testbed.ROOT / "home/bob" / f"acct{tag}_claim"
    claim.mkdir(parents=True)
    (claim / "job.sub").write_text(job(args="-c pass", extra="accounting_group = cms"))
    testbed.run(["chroot", str(testbed.ROOT), "chown", "-R", "bob:bob", f"/home/bob/{claim.name}"])
    cp = as_user(["condor_submit", "job.sub"], user="bob", cwd=f"/home/bob/{claim.name}")
    said = cp.stdout + cp.stderr
    assert cp.returncode != 0, said
    assert "user bob may not use accounting group cms" in said and testbed.ACCT_GROUP_MAP_PATH in said, said
    cp = as_root(["condor_q", "-allusers", "-constraint", 'Owner == "bob" && AcctGroup =?= "cms"', "-af", "ClusterId"])
    assert cp.returncode == 0 and cp.stdout.strip() == "", cp.stdout

    # Around the check: a job submitted without a group (held, it never runs), then the group edited in.
    held = submit(f"acct{tag}_edit", job(args="-c pass", extra="hold = true"), user="bob")
    try:
        for target in (str(held), f"{held}.0"):   # the cluster ad and the job's own
            cp = as_user(["condor_qedit", target, "AcctGroup", '"cms"'], user="bob")
            assert cp.returncode != 0 and "Failed to set attribute" in cp.stderr, (target, cp.stdout, cp.stderr)
        assert queue_attrs(held, ["AcctGroup"]) == ["undefined"]
    finally:
        as_root(["condor_rm", str(held)])

    # alice is mapped to cms: her job is accepted, runs once, and its ad keeps the group Lark and the controller see.
    cluster = submit_script(f"acct{tag}_cms", "print('ran')\n", extra="accounting_group = cms", user="alice")
    code, group, network = history(cluster, ["ExitCode", "AcctGroup", "LarkNetworkType"], timeout=180)
    assert starts(cluster) == {0: ["execute"]}
    assert (code, group) == ("0", "cms") and network != "undefined", (code, group, network)
