"""larkd dies between two steps of a job's setup (after the record's first write, before "ready"): the record it
left on disk is enough for `lark gc` to remove everything the setup had made, on the real kernel and firewall.

The record is written before the first kernel object and then only when a step changes what a restart reads
(lark/daemon/records.py, crash_view), so the steps between leave it as it was; each case here kills the setting-up
process (os._exit, no undo, as SIGKILL) right after one step and checks what is left."""
from __future__ import annotations

import json
import os
import subprocess
import time

import pytest

from helpers.fakehost import PY, sh

EMPTY = {"netns": [], "links": [], "fw": [], "elements": [], "locks": [], "records": []}

# In the fake host's netns: larkd's own JobNetworker on the host's configuration, one NAT job with a limit, the
# process killed (exit 9, nothing undone) right after the named step returns.
CRASH = r"""
import dataclasses, os, sys
from lark import config
from lark.daemon import peercred
from lark.daemon.jobnet import JobNetworker
from lark.daemon.records import FinishedStore, RecordStore
from lark.kernel import ipam, netns
from lark.kernel.accounting import Accountant
from lark.kernel.firewall import make_firewall
from lark.plan import NetworkPlan

cfg_path, step, job_pid = sys.argv[1], sys.argv[2], int(sys.argv[3])
cfg = config.load(cfg_path, warn=False)
fw = make_firewall(cfg)
fw.ensure_base()
netns.ensure_netns_dir(cfg.netns_dir)
net = JobNetworker(cfg, fw, RecordStore(cfg.records_dir), Accountant(fw),
                   FinishedStore(os.path.join(cfg.state_dir, "finished")))

def crash_after(obj, name):
    real = getattr(obj, name)
    def then_die(*a, **k):
        out = real(*a, **k)
        os._exit(9)
    if obj is net.kernel:   # the kernel operations are given to the JobNetworker (lark/kernel/ops.py)
        net.kernel = dataclasses.replace(net.kernel, **{name: then_die})
    else:
        setattr(obj, name, then_die)

targets = {"reservations": (ipam.LockPool, "reserve"), "veth": (net.kernel, "create_veth"),
           "attach": (net.modes["nat"], "attach"), "shaping": (net.kernel, "apply_shaping"),
           "firewall": (fw, "add_job")}
crash_after(*targets[step])
me = os.getpid()
net.setup(NetworkPlan(job_id="9.0", slot="slot1", key="slot1", network_type="nat", rate_limit_mbit=50.0,
                      inbound=True), me, peercred.start_time(me), job_pid, netns.netns_inode_of_pid(job_pid))
sys.exit(0)
"""


@pytest.mark.parametrize("step", ["reservations", "veth", "attach", "shaping", "firewall"])
def test_a_crash_between_setup_steps_leaves_a_record_gc_cleans_up_from(host, step):
    host.stop_larkd()
    job = subprocess.Popen(host.in_host(["unshare", "--net", "sleep", "600"]))
    host.procs.append(job)
    host_ino = os.stat(f"/run/netns/{host.host_ns}").st_ino
    deadline = time.time() + 10
    while os.stat(f"/proc/{job.pid}/ns/net").st_ino == host_ino:  # until unshare has made the job's netns
        assert time.time() < deadline, "the job's empty netns did not appear"
        time.sleep(0.01)
    cp = sh(host.in_host([PY, "-c", CRASH, str(host.cfg_path), step, str(job.pid)]), check=False,
            env={**os.environ, "PYTHONPATH": os.getcwd()})
    assert cp.returncode == 9, f"the setup did not reach the {step} step: {cp.stderr}"
    left = host.residue()
    assert left["records"] == ["slot1.json"], left
    with open(os.path.join(host.cfg.records_dir, "slot1.json")) as f:
        rec = json.load(f)
    assert rec["phase"] == "setting-up" and rec["job_id"] == "9.0" and rec["plan"]["network_type"] == "nat"
    assert left["netns"] and left["locks"], f"the setup made nothing before its {step} step: {left}"
    if step != "reservations":
        assert left["links"], left
    if step == "firewall":
        assert left["fw"], left
    out = host.lark("gc").stdout
    assert "slot1" in out, out
    assert host.residue() == EMPTY, out
    assert host.lark("gc", "--dry-run").stdout.strip() == "nothing to remove"
