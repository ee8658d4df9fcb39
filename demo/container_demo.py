"""Live demo of docker-universe jobs on a Lark execution point (issue 25): each container gets the job's own network
from larkd, the way a vanilla job does, and the networks Lark does not manage are refused.

Starts the testbed (testbed/testbed.py) and its dockerd (opt-in, in the EP's netns and root, with Lark's OCI runtime
registered), imports a busybox image (no registry is reachable), points HTCondor's DOCKER at Lark's wrapper, adds the
paper's NetworkType policy, and submits three docker jobs with file transfer:
- alice, `request_bandwidth = 100`: downloads 50 MB from the world through her own NAT address, limited and counted;
- bob, `+OutboundConnectivity = false`: the policy gives him no network, so his container sees only `lo`;
- carol, `docker_network_type = host`: refused, held with Lark's reason (never run with the EP's network).
Prints one table from condor_history, each job's output and carol's hold reason, then stops dockerd and the pool.
Fails (exit 1) when a job that should run did not start exactly once, or carol's job was not held.
"""
from __future__ import annotations

import logging
import shutil
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "testbed"))
sys.path.insert(0, str(REPO / "demo"))
import eventlog  # noqa: E402
from pool_demo import POLICY_CONF, not_started_once, show, stop_pool, wait_history  # noqa: E402

import testbed  # noqa: E402

log = logging.getLogger("demo")
# What each container reports: its interfaces, its address, and what it could fetch from the world.
SCRIPT = """ip -o link | cut -d: -f2 | cut -d@ -f1 | tr -d ' ' | tr '\\n' ' '; echo
ip -o -4 addr show dev eth0 2>/dev/null | sed 's/.* inet //; s/[/ ].*//'
t() {{ read u _ < /proc/uptime; echo "$u"; }}
a=$(t); n=$(wget -q -T 5 -O - http://{world}:8000/50M.bin | wc -c); b=$(t)
echo "fetched $n bytes from the world in $(echo "$a $b" | awk '{{printf "%.2f", $2 - $1}}') s"
"""
# (user, directory, what the job asks for)
JOBS = [
    ("alice", "demo-docker-nat", "request_bandwidth = 100"),
    ("bob", "demo-docker-none", "+OutboundConnectivity = false"),
    ("carol", "demo-docker-host", "docker_network_type = host"),
]


def submit_file(image: str, extra: str) -> str:
    return (f"universe = docker\ndocker_image = {image}\nexecutable = /bin/sh\ntransfer_executable = false\n"
            "arguments = job.sh\ntransfer_input_files = job.sh\noutput = out.txt\nerror = err.txt\nlog = log.txt\n"
            f"should_transfer_files = YES\nwhen_to_transfer_output = ON_EXIT\n{extra}\nqueue\n")


def submit(user: str, name: str, image: str, extra: str) -> int:
    d = testbed.ROOT / "home" / user / name
    shutil.rmtree(d, ignore_errors=True)  # no output of an earlier run
    d.mkdir(parents=True)
    (d / "job.sh").write_text(SCRIPT.format(world=testbed.WORLD_IP))
    return testbed.submit_as(user, name, submit_file(image, extra))


def hold_reason(cluster: int, timeout: float = 120) -> str:
    deadline = time.time() + timeout
    while time.time() < deadline:
        cp = testbed.run(testbed.in_root(["condor_q", str(cluster), "-af", "JobStatus", "HoldReason"]), check=False)
        status, _, reason = cp.stdout.strip().partition(" ")
        if status == "5":
            return reason
        time.sleep(2)
    return ""


def main() -> int:
    logging.basicConfig(level=logging.INFO, format="demo: %(message)s")
    testbed.prepare("demo-docker")
    policy = (REPO / "policies/network_type_by_connectivity.ad").read_text().strip().splitlines()[-1]
    POLICY_CONF.write_text(policy + "\n")
    try:
        testbed.start()
        image = testbed.enable_docker_jobs()
        clusters: dict[int, str] = {}
        for user, name, extra in JOBS:
            c = submit(user, name, image, extra)
            clusters[c] = extra.replace("+", "")
            log.info("%s submitted docker job %d.0 asking for: %s", user, c, extra)
        *ran, refused = clusters
        reason = hold_reason(refused)
        testbed.run(testbed.in_root(["condor_rm", str(refused)]), check=False)
        rows = wait_history({c: clusters[c] for c in ran})
        print()
        show({c: clusters[c] for c in ran}, rows)
        print()
        failed = []
        for (user, name, _), c in zip(JOBS, clusters, strict=True):
            d = testbed.ROOT / "home" / user / name
            if c == refused:
                print(f"job {c}.0 ({user}, docker_network_type = host) held: {reason or '(not held)'}")
                continue
            out = d / "out.txt"
            printed = out.read_text().strip().replace("\n", " | ") if out.exists() else "(no out.txt)"
            print(f"job {c}.0 ({user}) printed: {printed}")
            failed += [eventlog.describe(job, events)
                       for job, events in eventlog.not_once(d / "log.txt", [f"{c}.0"]).items()]
        print()
        if not_started_once(failed):
            return 1
        if len(rows) != len(ran) or "Lark" not in reason:
            print(f"{len(rows)} of {len(ran)} jobs reached the history; carol's job held with Lark's reason: "
                  f"{'Lark' in reason}")
            return 1
        print("both networked jobs started once and finished; the host-network job was held, never run")
        return 0
    finally:
        POLICY_CONF.unlink(missing_ok=True)
        if testbed.load_state().get("master_pid"):
            testbed.disable_docker_jobs()
        stop_pool()


if __name__ == "__main__":
    sys.exit(main())
