"""Bandwidth limits on the real kernel: from the slot's allocation, both directions, out of the job's reach.

Speed goals live in bench/bandwidth_accuracy.py. These tests only use lower bounds on time (a transfer can not
beat its limit; a slow machine only makes it slower), so they can not flake on a noisy VM.
"""
import json
import re

import pytest

from helpers.fakehost import WORLD_IP, sh
from helpers.waits import wait_ready

MB = 1_000_000


def job_netns(host, slot):
    j = wait_ready(host, slot)
    return j["netns"], j["host_if"]


def htb_rate_bit(host, argv_prefix, dev):
    """The rate of class 1:1 on a device as `tc class show` prints it (tc has no JSON for htb classes)."""
    out = sh([*argv_prefix, "tc", "class", "show", "dev", dev]).stdout
    m = re.search(r"class htb 1:1 .*?\brate (\d+(?:\.\d+)?)([KMGT]?)bit", out)
    if not m:
        return None
    return round(float(m.group(1)) * {"": 1, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12}[m.group(2)])


def test_slot_bandwidth_limits_both_directions(host):
    (host.www / "4M.bin").write_bytes(b"\0" * (4 * MB))
    mbit = 40
    host.publish_ad("slot1", "ClusterId = 21\nProcId = 0", f"Bandwidth = {mbit}\nRequestBandwidth = 1000")
    cp = host.spawn_job("slot1", ["timed-download-upload", f"http://{WORLD_IP}:8000/4M.bin", WORLD_IP, "7001",
                                  str(4 * MB)], job_ad="ClusterId = 21\nProcId = 0\nRequestBandwidth = 1000")
    netns, host_if = job_netns(host, "slot1")
    # The job asked for 1000 in its own ad; the slot was allocated 40: the allocation wins.
    assert htb_rate_bit(host, host.in_host([]), host_if) == mbit * MB
    assert htb_rate_bit(host, ["ip", "netns", "exec", netns], "eth0") == mbit * MB
    out, err = cp.communicate(timeout=120)
    assert cp.returncode == 0, err + host.larkd_log()
    r = json.loads(out)
    assert r["downloaded"] == r["uploaded"] == 4 * MB
    floor = 4 * MB * 8 / (mbit * MB) * 0.9  # 0.8 s at the limit; the bucket holds a few ms of that
    assert r["down_s"] >= floor, r
    assert r["up_s"] >= floor, r


def test_job_cannot_remove_its_limit(host):
    host.publish_ad("slot2", "ClusterId = 22\nProcId = 0", "Bandwidth = 10")
    cp = host.run_job("slot2", ["run", "tc", "qdisc", "del", "dev", "eth0", "root"],
                      job_ad="ClusterId = 22\nProcId = 0")
    assert cp.returncode == 0, cp.stderr + host.larkd_log()
    r = json.loads(cp.stdout)
    assert r["rc"] != 0 and ("Operation not permitted" in r["stderr"] or "RTNETLINK" in r["stderr"]), r


VETH_MBIT = 10_000   # the speed the kernel's veth driver reports (the fake host's uplink up0 is a veth)


@pytest.mark.parametrize("policy,expect_mbit", [("fair", VETH_MBIT), ("unlimited", None)])
def test_no_allocation_and_no_inventory_shares_the_uplinks_speed_unless_unlimited_is_set(
        fakehost_factory, policy, expect_mbit):
    """Issue 23 item 13: a slot with no Bandwidth inventory (nor bandwidth_mbit) used to run its job unlimited;
    it now gets its fair share of the uplink's link speed, and runs unlimited only when the admin says so."""
    host = fakehost_factory(default_bandwidth=policy)
    host.publish_ad("slot3", "ClusterId = 23\nProcId = 0", "Bandwidth = 0")
    p = host.spawn_job("slot3", ["listen", "9000", "120"], job_ad="ClusterId = 23\nProcId = 0")
    netns, host_if = job_netns(host, "slot3")
    expect_bit = expect_mbit * MB if expect_mbit else None
    assert htb_rate_bit(host, host.in_host([]), host_if) == expect_bit, host.larkd_log()
    assert htb_rate_bit(host, ["ip", "netns", "exec", netns], "eth0") == expect_bit
    host.end_job(p, netns)   # its listen window is long so that a loaded machine reads tc while it runs


@pytest.mark.parametrize("policy,machine,expect_mbit", [
    ("25", "", 25),
    ("share", "TotalBandwidth = 1000\nCpus = 2\nTotalCpus = 8", 250),
])
def test_default_policy_for_jobs_without_allocation(fakehost_factory, policy, machine, expect_mbit):
    host = fakehost_factory(default_bandwidth=policy)
    host.publish_ad("slot1", "ClusterId = 24\nProcId = 0", machine or "Cpus = 1")
    p = host.spawn_job("slot1", ["listen", "9000", "120"], job_ad="ClusterId = 24\nProcId = 0")
    netns, host_if = job_netns(host, "slot1")
    assert htb_rate_bit(host, host.in_host([]), host_if) == expect_mbit * MB
    assert htb_rate_bit(host, ["ip", "netns", "exec", netns], "eth0") == expect_mbit * MB
    host.end_job(p, netns)   # its listen window is long so that a loaded machine reads tc while it runs


def test_rates_above_34_gbit_use_64_bit_fields(host):
    host.publish_ad("slot4", "ClusterId = 25\nProcId = 0", "Bandwidth = 40000")
    p = host.spawn_job("slot4", ["listen", "9000", "120"], job_ad="ClusterId = 25\nProcId = 0")
    netns, host_if = job_netns(host, "slot4")
    assert htb_rate_bit(host, host.in_host([]), host_if) == 40_000 * MB
    assert htb_rate_bit(host, ["ip", "netns", "exec", netns], "eth0") == 40_000 * MB
    host.end_job(p, netns)   # its listen window is long so that a loaded machine reads tc while it runs
    assert host.wait_clean() == {k: [] for k in host.residue()}
