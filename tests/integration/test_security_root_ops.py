"""A hostile job calls larkd's root-only operations on the fake execution point (the real larkd, the real kernel):
`sandbox_limit` (issue 22: lark-starter, as root, asks for its own cgroup and policers) and `docker_setup` (issue 25:
lark-oci-runtime, as root, asks larkd to plumb a container's netns), once as itself and once as uid 0 of a user
namespace it made (`unshare --user --map-root-user`). SO_PEERCRED reports the uid as larkd's user namespace sees it
(the job's real uid), so both are refused with an error that names the asker, and nothing changes: no cgroup under
LARK_SANDBOX_CGROUP for the asker, no rule in the EP's nft table inet <table>_sandbox, no netns, link or record but
the job's own, and larkd goes on serving. The asker is the job itself (in its netns, under lark-job-wrapper) or a
process of the job's uid in the EP's own netns (where HTCondor runs the job's hooks and transfer plugins, and where
lark-starter asks): larkd's other checks (same netns as larkd, a container dockerd knows) would not stop the latter."""
import json
import os
import subprocess

import pytest
from helpers.fakehost import HERE, sh
from helpers.waits import wait_ready
from test_security_daemon import HOSTILE, results, signal_dir

from lark.kernel.sandbox_police import cgroup2_mount

CONTAINER = "c0ffee" * 10 + "abcd"   # 64 hex digits: a container id docker never gave out
# What lark-starter sends for a slot: a starter's argv, forged by the job (its own slot and another's).
OPS = {
    "sandbox_limit": ("operation sandbox_limit is for root only",
                      [{"slot": "slot5", "argv": ["/usr/sbin/condor_starter", "-f", "-a", "slot5", "sched"]},
                       {"slot": "slot6", "argv": ["/usr/sbin/condor_starter", "-f", "-a", "slot6", "sched"]}]),
    "docker_setup": ("docker_setup is for the root OCI runtime",
                     [{"container": CONTAINER, "pid": 31337},
                      {"container": CONTAINER, "pid": 31337, "netns": "/proc/1/ns/net"}]),
}


def sandbox_cgroups(host, pid: int) -> list[str]:
    """The cgroups larkd made for `pid` as a starter (<cgroup2 mount>/<sandbox_cgroup>/starter-<pid>-<start>). The
    parent is the machine's, shared with other larkds: only the asker's own name counts."""
    parent = os.path.join(cgroup2_mount() or "/nonexistent", host.cfg.sandbox_cgroup)
    return [n for n in os.listdir(parent) if n.startswith(f"starter-{pid}-")] if os.path.isdir(parent) else []


def sandbox_rules(host) -> list[str]:
    """The comments of the rules in the EP netns's table inet <table>_sandbox ([] when the table is not there)."""
    cp = sh(host.in_host(["nft", "-j", "list", "table", "inet", f"{host.cfg.nft_table}_sandbox"]), check=False)
    if cp.returncode != 0:
        return []
    return [o["rule"].get("comment", "") for o in json.loads(cp.stdout)["nftables"] if "rule" in o]


def steps_until(p: subprocess.Popen, last: str) -> list[str]:
    """The job's result lines up to the one of step `last` (the job then waits for the test)."""
    lines = []
    while True:
        line = p.stdout.readline()
        if not line:
            raise AssertionError(f"the job ended before its step {last}: {lines} {p.stderr.read()}")
        lines.append(line)
        if line.startswith("{") and json.loads(line)["step"] == last:
            return lines


def spawn(host, steps: list[str], in_job_netns: bool) -> subprocess.Popen:
    """The hostile steps as the job (uid 65534 under the test starter of slot5), in its own netns behind
    lark-job-wrapper, or in the EP's netns (-H, no wrapper) as its hooks and transfer plugins run."""
    host.publish_ad("slot5", "ClusterId = 45\nProcId = 0", "Bandwidth = 20")
    argv = host.job_argv("slot5", steps, host_netns=not in_job_netns, wrapper=in_job_netns)
    argv[argv.index(str(HERE / "workload.py"))] = HOSTILE
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    host.procs.append(p)
    return p


@pytest.mark.parametrize("where", ["job-netns", "ep-netns"])
@pytest.mark.parametrize("op", sorted(OPS))
def test_a_job_cannot_call_root_only_ops_even_as_root_of_its_own_user_namespace(host, op, where):
    refusal, requests = OPS[op]
    here, go = signal_dir(host) / f"asked-{op}", signal_dir(host) / f"checked-{op}"   # go: the test is done
    steps = [x for fields in requests for x in ("raw", op, json.dumps(fields), "userns-raw", op, json.dumps(fields))]
    p = spawn(host, [*steps, "touch", str(here), "wait-file", str(go)], where == "job-netns")
    own = [wait_ready(host, "slot5")["netns"]] if where == "job-netns" else []
    asked = steps_until(p, "touch")
    askers = [a["pid"] for a in results("".join(asked))["raw"] + results("".join(asked))["userns-raw"]]
    # While the asking processes still run (a change made for them would still stand): no cgroup, no policer,
    # nothing but the job's own network.
    assert [n for pid in askers for n in sandbox_cgroups(host, pid)] == [], host.larkd_log()
    assert sandbox_rules(host) == [], host.larkd_log()
    jobs = host.status()   # larkd still serves
    assert [(j["slot"], j["phase"]) for j in jobs] == [("slot5", "ready")] * len(own), jobs
    assert [n for n in os.listdir("/run/netns") if n.startswith(host.cfg.netns_prefix)] == own
    records = os.listdir(host.cfg.records_dir) if os.path.isdir(host.cfg.records_dir) else []
    assert len(records) == len(own) and all("slot5" in n for n in records), records
    go.touch()
    out, err = p.communicate(timeout=90)
    assert p.returncode == 0, err + host.larkd_log()
    r = results("".join(asked) + out)
    attempts = r["raw"] + r["userns-raw"]
    assert len(attempts) == 2 * len(requests), r
    for a in r["userns-raw"]:
        assert a["uid"] == 0, a   # root of its own user namespace: the attack really ran
    for a in attempts:
        assert a["answer"] is not None and a["answer"]["ok"] is False, a
        assert refusal in a["answer"]["error"], a
        # The error names the asker as the kernel sees it: the job's pid and its real uid, not 0.
        assert f"pid {a['pid']} uid 65534" in a["answer"]["error"], a
    assert host.larkd.poll() is None, host.larkd_log()
    assert host.wait_clean() == {"netns": [], "links": [], "fw": [], "elements": [], "locks": [], "records": []}
