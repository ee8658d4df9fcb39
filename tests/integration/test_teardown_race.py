"""A slot's next job while larkd still tears down its previous one in the background (issue 15).

The starter's exit starts the teardown in the background (nothing of it is on the starter's path); the slot's next
job can ask for its network while that teardown runs, before it starts, or after it ended. Every order must give
the new job a working network, record each job's final figures once, and leave nothing behind.
"""
import json
import os

from helpers.fakehost import HOST_IP, WORLD_IP
from helpers.waits import finished

ROUNDS = 8


def finished_ids(host) -> list[str]:
    d = os.path.join(host.cfg.state_dir, "finished")
    ids = []
    for name in sorted(os.listdir(d)):
        if name.endswith(".json"):
            with open(os.path.join(d, name)) as f:
                ids.append(json.load(f)["job_id"])
    return ids


def test_next_job_on_a_slot_copes_with_the_background_teardown(fakehost_factory):
    host = fakehost_factory()
    for i in range(ROUNDS):
        # Back to back: the next job's wrapper connects ~10-20 ms after the previous starter exited, while
        # larkd's teardown of that job (~40 ms here) is in progress.
        cp = host.run_job("race1", ["whoami", WORLD_IP, "7000"], job_ad=f"ClusterId = {300 + i}\nProcId = 0")
        assert cp.returncode == 0, f"round {i}: {cp.stderr}\n{host.larkd_log()}"
        assert json.loads(cp.stdout)["seen_as"] == HOST_IP, cp.stdout
    for i in range(ROUNDS):
        s = finished(host, f"{300 + i}.0")
        assert s["reason"] in ("starter exited", "replaced by a new job"), s
    assert sorted(finished_ids(host)) == sorted(f"{300 + i}.0" for i in range(ROUNDS))
    assert host.wait_clean() == {k: [] for k in host.residue()}
    log = host.larkd_log()
    assert "ERROR" not in log and "Traceback" not in log, log
