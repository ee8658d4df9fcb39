"""The paper's three SDN policies observed from inside real jobs on two EPs of the pool testbed.

The jobs (pool_probe.policy_jobs): alice and bob on both EPs, a second alice job on ep1, alice's ep2 job in
accounting group "students", carol on ep2. The policies (pool.SDN_POLICIES): drop Owner == "carol"; a slice per
Owner; no WAN for AcctGroup "students"; bob's WAN traffic out of the alternate port wan1. Pairs on one EP hold too:
the EPs isolate their job ports (bridge_isolate_jobs) and the core switch sends allowed frames back (ep_ports).
The jobs use file transfer (no shared filesystem), and each one's event log must show exactly one start.
"""
import time

import pytest
from pool_probe import start_problems

pytestmark = pytest.mark.e2e


def seen(policy_run, src: str, dst: str) -> str:
    jobs, _ = policy_run
    return jobs[src].seen[dst]


def test_every_probe_job_started_once_and_was_never_evicted(policy_run):
    jobs, _ = policy_run
    assert all(j.starts is not None for j in jobs.values())
    assert start_problems(list(jobs.values())) == []


def test_same_owner_reaches_its_job_on_the_other_ep(policy_run):
    for src, dst in (("alice@ep1", "alice@ep2"), ("alice@ep2", "alice@ep1"), ("bob@ep1", "bob@ep2"),
                     ("bob@ep2", "bob@ep1")):
        assert seen(policy_run, src, dst) == "reached", (src, dst)


def test_slice_keeps_other_owners_apart_across_eps(policy_run):
    for src, dst in (("alice@ep1", "bob@ep2"), ("bob@ep2", "alice@ep1"), ("bob@ep1", "alice@ep2"),
                     ("alice@ep2", "bob@ep1")):
        assert seen(policy_run, src, dst).startswith("blocked"), (src, dst)


def test_dropped_owner_reaches_nothing_and_nothing_reaches_it(policy_run):
    jobs, _ = policy_run
    carol = jobs["carol@ep2"]
    assert carol.address, "carol's job got no address"
    for dst in ("alice@ep1", "bob@ep1"):
        assert seen(policy_run, "carol@ep2", dst).startswith("blocked"), dst
        assert seen(policy_run, dst, "carol@ep2").startswith("blocked"), dst
    assert seen(policy_run, "carol@ep2", "wan").startswith("blocked")


def test_wan_steer_sends_bobs_jobs_out_of_the_alternate_port(policy_run):
    assert seen(policy_run, "bob@ep1", "wan") == "wan1"
    assert seen(policy_run, "bob@ep2", "wan") == "wan1"
    assert seen(policy_run, "alice@ep1", "wan") == "wan0"  # everyone else: the normal WAN port


def test_wan_drop_for_the_students_group(policy_run):
    assert seen(policy_run, "alice@ep2", "wan").startswith("blocked")
    # the same owner outside the group keeps its WAN, and the group's job keeps its slice
    assert seen(policy_run, "alice@ep1", "wan") == "wan0"
    assert seen(policy_run, "alice@ep2", "alice@ep1") == "reached"


def test_controller_knew_every_job_while_it_ran_and_none_after(policy_run, controller_status):
    jobs, views = policy_run
    running = views["running"]
    assert {j["job_id"] for j in running["jobs"]} >= {f"{j.cluster}.0" for j in jobs.values()}, running["jobs"]
    assert running["totals"]["job_flows"] > 0
    # The jobs have left the queue: larkd unregistered each at teardown, and its flows went with it.
    deadline = time.time() + 60
    after = controller_status()
    while after["totals"]["jobs"] and time.time() < deadline:
        time.sleep(1)
        after = controller_status()
    assert after["totals"]["jobs"] == 0 and after["totals"]["job_flows"] == 0, after


def test_policies_hold_while_the_controller_is_down_and_it_rebuilds_its_view(lark_pool, policy_run,
                                                                              controller_status):
    # Proactive flows: once the jobs run, kill -9 the controller; the switch (fail_mode=secure) keeps every
    # job's flows, so the jobs see the same policies. The restarted controller learns the jobs again from
    # the EPs' resyncs (larkd resyncs at least every controller_resync = 30 s).
    from pool_probe import ProbeJob, run_probes
    views = {}

    def restart() -> None:
        lark_pool.restart_controller()
        deadline = time.time() + 45
        views["after_restart"] = controller_status()
        while views["after_restart"]["totals"]["jobs"] < 3 and time.time() < deadline:
            time.sleep(1)
            views["after_restart"] = controller_status()

    jobs = {j.label: j for j in run_probes([ProbeJob("alice", "ep1"), ProbeJob("alice", "ep2"),
                                            ProbeJob("bob", "ep2")], run="down",
                                           before_probing=lark_pool.kill_controller, while_running=restart)}
    assert start_problems(list(jobs.values())) == []
    assert jobs["alice@ep1"].seen["alice@ep2"] == "reached"
    assert jobs["alice@ep1"].seen["bob@ep2"].startswith("blocked")
    assert jobs["bob@ep2"].seen["wan"] == "wan1"
    assert jobs["alice@ep1"].seen["wan"] == "wan0"
    assert {j["job_id"] for j in views["after_restart"]["jobs"]} == {f"{j.cluster}.0" for j in jobs.values()}


def test_the_policies_hold_between_jobs_on_the_same_ep(policy_run, controller_status):
    # the same owner on one EP: up to the core switch and back out of the EP's port (the hairpin flow)
    for src, dst in (("alice@ep1", "alice2@ep1"), ("alice2@ep1", "alice@ep1")):
        assert seen(policy_run, src, dst) == "reached", (src, dst)
    # different owners on one EP: the slice, as across EPs
    for src, dst in (("alice@ep1", "bob@ep1"), ("bob@ep1", "alice@ep1"), ("alice2@ep1", "bob@ep1"),
                     ("alice@ep2", "bob@ep2"), ("bob@ep2", "alice@ep2")):
        assert seen(policy_run, src, dst).startswith("blocked"), (src, dst)
    # the dropped owner reaches nobody on its own EP, and nobody there reaches it
    for other in ("alice@ep2", "bob@ep2"):
        assert seen(policy_run, "carol@ep2", other).startswith("blocked"), other
        assert seen(policy_run, other, "carol@ep2").startswith("blocked"), other
    # flows per job stay constant: 7 for a sliced job on an isolated EP with an [ep.NAME] section (5, the hairpin,
    # and the drop of its MAC from other switch ports), 2 for a dropped one
    _, views = policy_run
    flows = {j["owner"]: j["flows"] for j in views["running"]["jobs"]}
    assert flows == {"alice": 7, "bob": 7, "carol": 2}, views["running"]["jobs"]
