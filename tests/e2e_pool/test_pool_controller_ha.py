"""No single point of failure (issue 26, docs/controller.md "HA model"): the pool runs two equal lark-controllers and
every larkd registers with both. Controller 0 is killed with -9 in the middle of a burst of job starts (once the
first of them is registered): no job is refused or starts twice, every job has its flows on the core switch, the
paper's policies (the dropped owner, slices, WAN drop and steering) hold as seen from inside the jobs, controller 1
registered jobs after the kill, and controller 0, started again, is whole within seconds (EPs resync it at once).
Figures go to the log; the bounds asserted are generous (the 1 s figure is a measurement: docs/controller.md)."""
import logging

import pytest
from pool_probe import policy_jobs, policy_mismatches, run_probes, start_problems

pytestmark = pytest.mark.e2e
log = logging.getLogger(__name__)
SERVED_BOUND = 15.0   # s from the kill to controller 1's next registration of a job of the burst
WHOLE_BOUND = 15.0    # s from controller 0's restart (switch ready) to all running jobs registered there


def switch_cookies(pool) -> dict[str, int]:
    """Flows per cookie on the core switch, read from OVS itself."""
    cp = pool.run(["ovs-ofctl", "-O", "OpenFlow13", "dump-flows", f"unix:{pool.OVS_DIR}/{pool.SWITCH}.mgmt"])
    out: dict[str, int] = {}
    for line in cp.stdout.splitlines():
        if "cookie=" in line:
            cookie = line.split("cookie=", 1)[1].split(",", 1)[0]
            out[cookie] = out.get(cookie, 0) + 1
    return out


def test_kill_9_of_one_controller_during_a_burst_of_job_starts(lark_pool):
    if not lark_pool.controller_available() or lark_pool.load_state().get("controllers", 1) < 2:
        pytest.skip("the pool runs fewer than two controllers")
    views: dict = {}

    def while_running() -> None:
        views["switch"] = switch_cookies(lark_pool)
        views["at1"] = lark_pool.controller_status(1)
        views["whole_s"] = lark_pool.restart_until_whole(0, {j["job_id"] for j in views["at1"]["jobs"]})
        views["at0"] = lark_pool.controller_status(0)

    killer = lark_pool.KillDuringStarts(victim=0, witness=1, after=1)
    killer.start()
    try:
        jobs = run_probes(policy_jobs(), run="ha", while_running=while_running)
    finally:
        killer.stop()   # and controller 0 started again if the test did not get to it: the next tests want both
    assert killer.at is not None, "controller 0 was never killed: no registration seen at controller 1"
    # no job refused (controller_failure = closed would have failed its start) or started twice
    assert start_problems(jobs) == []
    assert policy_mismatches(jobs) == []
    # every job is registered at the surviving controller with all its flows on the switch
    at1 = {j["job_id"]: j for j in views["at1"]["jobs"]}
    assert set(at1) >= {f"{j.cluster}.0" for j in jobs}, at1.keys()
    for job in jobs:
        e = at1[f"{job.cluster}.0"]
        assert views["switch"].get(e["cookie"], 0) == e["flows"] > 0, (job.label, e, views["switch"])
        assert e["flows"] == (2 if job.user == "carol" else 7), (job.label, e["flows"])
    after = sorted(e["registered"] for e in at1.values() if e["registered"] > killer.at)
    log.warning("controller 0 killed with %d of %d jobs registered at controller 1; the first registration after "
                "the kill %.2f s later; controller 0 whole %.2f s after its restart", len(at1) - len(after), len(at1),
                after[0] - killer.at if after else -1.0, views["whole_s"])
    assert after, "every job was registered before the kill: it did not happen during the burst"
    assert after[0] - killer.at < SERVED_BOUND
    assert {j["job_id"] for j in views["at0"]["jobs"]} >= set(at1) and views["whole_s"] < WHOLE_BOUND
