"""Daemon crashes in the bridged modes: a restart adopts running jobs, and gc (with larkd down) removes what a
dead daemon left: the veth, the bridge-table rules, the OVS port and its flows, address locks, records."""
import shutil
import signal

import pytest

from helpers.fakehost import WORLD_IP
from helpers.waits import wait_ready

BRIDGED = dict(bridge_uplink="up0", ovs_uplink="up0", ovs_datapath="netdev", ovs_bridge_name="lkovs0",
               bridge_range="198.51.100.100-198.51.100.149", bridge_gateway=WORLD_IP)
MODES = ["bridge"] + (["ovs_bridge"] if shutil.which("ovs-vswitchd") else [])


@pytest.fixture(params=MODES)
def bhost(request, fakehost_factory):
    return fakehost_factory(default_network_type=request.param, ovs=request.param == "ovs_bridge", **BRIDGED)


def empty(host):
    return {k: [] for k in host.residue()}


def test_restart_adopts_a_running_bridged_job(bhost):
    job = bhost.spawn_job("slot1", ["sleep", "4"])
    wait_ready(bhost, "slot1")
    bhost.stop_larkd(signal.SIGKILL)
    bhost.start_larkd()
    assert [j["slot"] for j in bhost.status()] == ["slot1"], bhost.larkd_log()
    assert job.wait(30) == 0
    assert bhost.wait_clean() == empty(bhost)


def test_offline_gc_removes_what_a_killed_daemon_left(bhost):
    job = bhost.spawn_job("slot2", ["sleep", "1"])
    wait_ready(bhost, "slot2")
    bhost.stop_larkd(signal.SIGKILL)
    job.wait(30)
    left = bhost.residue()
    assert left["links"] and left["locks"] and left["records"], left
    if "ovs" in left:
        assert left["ovs"], left  # the port and its flows outlived the job
    assert "slot2" in bhost.lark("gc", "--dry-run").stdout
    bhost.lark("gc")
    assert bhost.residue() == empty(bhost)
    assert bhost.lark("gc").stdout.strip() == "nothing to remove"
