"""Every attach mode's error paths on the fake kernel (tests/helpers/fakekernel.py), through the real resource list,
engine, records and address pools: a failure at any step of a job's setup leaves nothing of that job behind,
teardown goes on past failures and a second one finishes, and gc finds and removes an orphan of each mode.

The steps are not listed by hand: each case first sets up a job that succeeds and takes the fake kernel's calls as
the list of steps to fail, so a resource added to a mode's profile is covered without editing this file.
"""
from __future__ import annotations

import os

import pytest
from helpers.fakekernel import FakeKernel, fake_networker

from lark.daemon.jobnet import JobNetworker
from lark.daemon.sweep import find_orphans, sweep
from lark.errors import LarkError
from lark.plan import NetworkPlan

MODES = ("nat", "bridge", "ovs_bridge")
# Steps that build nothing of the job's own, or whose failure teardown cannot see (reads, waits), or a shared
# object's setup (the bridge is the EP's, not the job's): their failure must still leave nothing of the job.
READS = {"links.link_stats", "nftables.verify_job"}


def _plan(mode: str, key: str = "slot1") -> NetworkPlan:
    return NetworkPlan(job_id="7.0", slot=key, key=key, network_type=mode, inbound=mode == "nat",
                       rate_limit_mbit=10.0)


def _setup(net: JobNetworker, mode: str, key: str = "slot1"):
    return net.setup(_plan(mode, key), os.getpid(), 1, os.getpid(), 99)


def _job_objects(k: FakeKernel, key: str) -> set[tuple[str, str]]:
    return k.of_key(key)


def _nothing_left(net: JobNetworker, k: FakeKernel, mode: str, key: str = "slot1") -> None:
    assert _job_objects(k, key) == set()
    assert net.records.keys() == []
    assert list(net.modes[mode].pool.entries()) == [] and list(net.ports.entries()) == []
    assert net.engine.keys() == {}  # gc finds nothing either


def _setup_steps(tmp: str, monkeypatch, mode: str) -> list[str]:
    net, k = fake_networker(tmp, monkeypatch, modes=(mode,))
    _setup(net, mode)
    return [c for c in dict.fromkeys(k.calls) if c not in READS]


@pytest.mark.parametrize("mode", MODES)
def test_each_mode_builds_its_own_objects_and_a_teardown_leaves_only_the_shared_ones(tmp_path, monkeypatch, mode):
    net, k = fake_networker(str(tmp_path), monkeypatch, modes=(mode,))
    rec = _setup(net, mode)
    kind = {"nat": "route", "bridge": "bridge-port", "ovs_bridge": "ovs-port"}[mode]
    assert rec.phase == "ready"
    address = rec.plan["ipv4"]
    assert (kind, f"{address}/slot1") in k.objects
    if mode == "nat":
        assert address.startswith("10.77.0.")
    else:  # a station on the site network: an address of bridge_range, the site's gateway, its own filter
        assert address == "192.0.2.10" and rec.plan["gateway4"] == "192.0.2.1"
        assert (f"{mode}-filter", "slot1") in k.objects
        assert (f"{mode}-shared", "host") in k.objects
    net.teardown("slot1", "job finished")
    _nothing_left(net, k, mode)
    shared = {o for o in k.objects if o[1] == "host"}
    assert k.objects == shared  # the bridge is the EP's: it stays for the next job


@pytest.mark.parametrize("mode", MODES)
def test_a_failure_at_any_step_of_any_mode_leaves_nothing_of_the_job(tmp_path, monkeypatch, mode):
    steps = _setup_steps(str(tmp_path / "probe"), monkeypatch, mode)
    assert len(steps) >= 8, steps  # netns, veth, attach, job side, dns, shaping, job netns filter, firewall
    if mode != "nat":
        assert f"{ {'bridge': 'bridge', 'ovs_bridge': 'ovs'}[mode]}.secure" in steps
    for i, step in enumerate(steps):
        net, k = fake_networker(str(tmp_path / f"s{i}"), monkeypatch, modes=(mode,))
        k.fail.add(step)
        with pytest.raises(LarkError, match=f"job 7.0: slot slot1: setup failed: injected failure of {step}"):
            _setup(net, mode)
        _nothing_left(net, k, mode)


@pytest.mark.parametrize("mode", MODES)
def test_teardown_of_any_mode_goes_on_past_each_failure_and_a_second_one_finishes(tmp_path, monkeypatch, mode):
    net, k = fake_networker(str(tmp_path), monkeypatch, modes=(mode,))
    _setup(net, mode)
    prefix = {"nat": "mode", "bridge": "bridge", "ovs_bridge": "ovs"}[mode]
    k.calls.clear()
    k.fail |= {f"{prefix}.detach", "nftables.remove_job"}
    with pytest.raises(LarkError, match=r"teardown finished with 2 error\(s\)") as e:
        net.teardown("slot1", "job finished")
    assert f"injected failure of {prefix}.detach" in str(e.value)
    assert "links.delete_link" in k.calls and "netns.detach" in k.calls  # went on past both failures
    assert net.records.keys() == ["slot1"]  # the record is kept so gc retries
    k.fail.clear()
    net.teardown("slot1", "job finished")
    _nothing_left(net, k, mode)


@pytest.mark.parametrize("mode", MODES)
def test_gc_finds_an_orphan_of_each_mode_by_its_objects_and_removes_it(tmp_path, monkeypatch, mode):
    net, k = fake_networker(str(tmp_path), monkeypatch, modes=(mode,))
    _setup(net, mode, "live")
    _setup(net, mode, "dead")
    os.unlink(os.path.join(net.cfg.records_dir, "dead.json"))  # a crash after the kernel work, before any record
    found = find_orphans(net, keep={"live"}, others=[])
    port = {"nat": "nat port", "bridge": "bridge port", "ovs_bridge": "ovs_bridge port"}[mode]
    assert "dead" in found and port in found["dead"] and "nftables rules" in found["dead"], found
    sweep(net, keep={"live"}, others=[])
    assert _job_objects(k, "dead") == set()
    assert _job_objects(k, "live") and net.records.keys() == ["live"]
