"""The pool's SDN policies, live: real HTCondor jobs of three users on two execution points, each trying to reach
every other job and the WAN from inside its own network namespace, with lark-controller programming the core
switch from what larkd registered.

Starts the pool testbed (testbed/pool.py: central manager, two EPs with their own larkd, a core Open vSwitch
with lark-controller, a WAN behind two links), runs one probe job per row below (with file transfer, as on a pool
without a shared filesystem), prints what each job could and could not reach, and stops the pool (also on failure
or Ctrl-C). It fails (exit 1) when an outcome is not what the policies say, or when a job's event log shows it
started more than once or was evicted. The policies are pool.SDN_POLICIES:
  drop       Owner == "carol": all of carol's traffic is dropped at the core switch
  slice      per Owner: jobs of different owners cannot talk, on one EP or across; the same owner's can
  wan_drop   AcctGroup == "students": nothing toward the WAN
  wan_steer  Owner == "bob": WAN traffic leaves through the alternate WAN port (wan1)
The pool runs two equal controllers (HA): controller 0 is killed with -9 as soon as the first job is registered,
so the other jobs start with their flows from controller 1; controller 0 is then started again and resynced by the
EPs at once (docs/controller.md, "HA model").
"""
from __future__ import annotations

import logging
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "testbed"))
import pool  # noqa: E402
import pool_probe  # noqa: E402
from pool_probe import policy_mismatches, start_problems  # noqa: E402

log = logging.getLogger("demo-pool")
WHY = {
    "alice@ep1": "no policy but the slice",
    "alice2@ep1": "alice's second job on ep1: reaches alice@ep1 through the core switch and back",
    "bob@ep1": "slice; WAN steered to wan1 (Owner == \"bob\")",
    "alice@ep2": "slice; accounting_group students: no WAN",
    "bob@ep2": "slice; WAN steered to wan1",
    "carol@ep2": "dropped: Owner == \"carol\"",
}


def main() -> int:
    logging.basicConfig(level=logging.INFO, format="demo-pool: %(message)s")
    if not pool.controller_available():
        log.warning("lark-controller is not in this tree: the switch only learns MACs, no policy applies")
    pool.tb.prepare("demo-pool")
    try:
        pool.start()
        status: list[str] = []
        whole: list[float] = []
        # Two controllers (HA): controller 0 is killed with -9 once the first job is registered, during the starts
        killer = pool.KillDuringStarts() if pool.load_state().get("controllers", 1) > 1 else None

        def controller_status() -> None:
            if pool.controller_available():
                survivor = 1 if killer is not None and killer.at is not None else 0
                conf = str(pool.controller_file(survivor))
                status.append(f"(controller {survivor}) " + pool.controller_cli("status", "--config", conf,
                                                                                check=False).stdout)
                if survivor:    # and controller 0, started again, is resynced by the EPs at once
                    ids = {j["job_id"] for j in (pool.controller_status(1) or {}).get("jobs", [])}
                    whole.append(pool.restart_until_whole(0, ids))

        if killer is not None:
            killer.start()
        try:
            jobs = pool_probe.run_probes(pool_probe.policy_jobs(), run="demo", while_running=controller_status)
        finally:
            if killer is not None:
                killer.stop()
        print()
        print(pool_probe.table(jobs))
        print("* same EP: the EP's bridge isolates job ports, so the core switch decides and sends allowed frames "
              "back (docs/pool.md)\n")
        for j in jobs:
            print(f"  {j.label:<10} {j.extra or '(no extra submit lines)':<30} {WHY.get(j.label, '')}")
        if status:
            print("\nlark-controller status while the jobs ran:")
            print(status[0])
        if killer is not None and killer.at is not None:
            print(f"HA: controller 0 was killed with -9 when controller 1 had {killer.registered_before} of "
                  f"{len(jobs)} jobs registered; the others started with their flows from controller 1; controller 0,"
                  f" started again, had every job {whole[0] if whole else float('nan'):.2f} s after its switch was "
                  "ready (docs/controller.md, HA model)")
        wrong = policy_mismatches(jobs)
        pairs = len(jobs) * len(jobs)          # each job: every other job and the WAN
        if wrong:
            print(f"\nthe policies did NOT hold for {len(wrong)} of {pairs} outcomes:")
            for line in wrong:
                print(f"  {line}")
        # A job the pool evicted and started again would have probed twice: its outcomes prove nothing.
        restarted = start_problems(jobs)
        if restarted:
            print(f"\n{len(restarted)} of {len(jobs)} jobs did NOT start exactly once (their event logs):")
            for line in restarted:
                print(f"  {line}")
        if wrong or restarted:
            return 1
        print(f"\nevery outcome is what the policies say ({pairs} of {pairs}); every job started once "
              f"({len(jobs)} of {len(jobs)}, file transfer)")
        return 0
    finally:
        pool.down()
        left = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
        if pool.PREFIX in left:
            log.error("pool namespaces are still there: %s", left)


if __name__ == "__main__":
    sys.exit(main())
