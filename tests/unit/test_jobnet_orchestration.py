"""jobnet and sweep against an in-memory kernel: the error paths a real kernel rarely produces."""
import dataclasses
import json
import os

import pytest

from helpers.fakekernel import FakeFirewall, fake_networker
from lark.daemon.sweep import find_orphans, sweep
from lark.errors import LarkError
from lark.plan import Addresses, JobNetwork, NetworkPlan


def _plan(key="slot1", **kw) -> NetworkPlan:
    return NetworkPlan(job_id="7.0", slot=key, key=key, **kw)


def _setup(net, key="slot1", **kw):
    return net.setup(_plan(key, **kw), starter_pid=os.getpid(), starter_start=1, job_pid=os.getpid(), job_ns=99)


def test_setup_builds_everything_and_records_addresses_without_touching_the_plan(tmp_path, monkeypatch):
    net, k = fake_networker(str(tmp_path), monkeypatch)
    plan = _plan(inbound=True, rate_limit_mbit=10.0)
    rec = net.setup(plan, os.getpid(), 1, os.getpid(), 99)
    assert k.of_key("slot1") == {("netns", "lark-slot1"), ("link", "lk-slot1"), ("route", "10.77.0.2/slot1"),
                                 ("fw:nftables", "slot1")}
    assert "shaping.apply" in k.calls
    assert rec.phase == "ready"
    assert rec.plan["ipv4"] == "10.77.0.2" and rec.plan["gateway4"] == "10.77.0.1"
    assert rec.plan["inbound_port"] == 20000
    assert plan.to_dict() == _plan(inbound=True, rate_limit_mbit=10.0).to_dict()  # decided plan unchanged
    assert net.records.load("slot1") == rec
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.network_type = "bridge"


def test_failed_setup_undoes_what_was_built_and_names_the_job(tmp_path, monkeypatch):
    net, k = fake_networker(str(tmp_path), monkeypatch)
    k.fail.add("nftables.add_job")
    with pytest.raises(LarkError, match=r"job 7.0: slot slot1: setup failed: injected failure of nftables.add_job"):
        _setup(net)
    assert k.of_key("slot1") == set()
    assert net.records.keys() == []
    assert list(net.modes["nat"].pool.entries()) == [] and list(net.ports.entries()) == []


def test_teardown_goes_on_past_a_failing_firewall_and_reports_every_error(tmp_path, monkeypatch):
    net, k = fake_networker(str(tmp_path), monkeypatch)
    _setup(net, inbound=True)
    k.fail |= {"nftables.remove_job", "mode.detach"}
    with pytest.raises(LarkError) as e:
        net.teardown("slot1", "test")
    msg = str(e.value)
    assert msg.startswith("job 7.0: job key slot1: teardown finished with 2 error(s): ")
    assert "could not remove the nftables rules: injected failure" in msg
    assert "could not detach from nat: injected failure" in msg and "lark gc" in msg
    # Everything else is gone: the veth, the namespace, the address and the port.
    assert k.of_key("slot1") == {("fw:nftables", "slot1"), ("route", "10.77.0.2/slot1")}
    assert list(net.modes["nat"].pool.entries()) == [] and list(net.ports.entries()) == []
    # The record stays (phase tearing-down) so gc retries; once the cause is gone gc finishes the job.
    assert net.records.load("slot1").phase == "tearing-down"
    k.fail.clear()
    actions = sweep(net, keep=set(), others=[])
    assert actions == ["slot1: record, nat port, nftables rules"]
    assert k.of_key("slot1") == set() and net.records.keys() == []


def test_teardown_is_idempotent_and_saves_one_finished_summary(tmp_path, monkeypatch):
    net, k = fake_networker(str(tmp_path), monkeypatch)
    _setup(net)
    summary = net.teardown("slot1", "starter exited")
    assert summary["bytes_in"] == 1000 and summary["bytes_out"] == 500 and summary["reason"] == "starter exited"
    assert summary["ipv4"] == "10.77.0.2" and summary["link_bytes_in"] == 1
    assert net.teardown("slot1", "again") is None
    assert len(net.finished.all()) == 1 and k.objects == set()


def test_sweep_removes_orphans_of_both_firewall_backends_and_keeps_live_jobs(tmp_path, monkeypatch):
    net, k = fake_networker(str(tmp_path), monkeypatch)
    other = FakeFirewall(net.cfg, k, name="iptables")
    _setup(net, "live")
    _setup(net, "dead")
    k.objects |= {("fw:iptables", "old"), ("fw:iptables", "base"), ("link", "lk-stray"),
                  ("link", "lk-not-a-key-at-all")}
    found = find_orphans(net, keep={"live"}, others=[other])
    assert found == {"dead": ["record", "netns lark-dead", "IPv4 addresses lock 10.77.0.3", "link lk-dead",
                              "nat port", "nftables rules"],
                     "old": ["iptables rules"], "stray": ["link lk-stray"]}
    before = set(k.objects)
    assert sweep(net, keep={"live"}, dry_run=True, others=[other])[0].startswith("dead: record")
    assert k.objects == before and net.records.keys() == ["dead", "live"]  # a dry run removes nothing
    actions = sweep(net, keep={"live"}, others=[other])
    assert actions[-1] == "base iptables objects (firewall is nftables)"
    # What is left: the live job, and a link whose name no job key can have (not Lark's to remove).
    assert {o for o in k.objects if "live" not in o[1]} == {("link", "lk-not-a-key-at-all")}
    assert k.of_key("live") == {("netns", "lark-live"), ("link", "lk-live"), ("route", "10.77.0.2/live"),
                                ("fw:nftables", "live")}


def test_sweep_goes_on_past_one_orphan_it_cannot_remove(tmp_path, monkeypatch):
    net, k = fake_networker(str(tmp_path), monkeypatch)
    _setup(net, "a")
    _setup(net, "b")
    k.fail.add("links.delete_link")
    actions = sweep(net, keep=set(), others=[])
    assert len(actions) == 2 and all("(incomplete: " in a and "could not delete lk-" in a for a in actions)
    assert k.of_key("a") == {("link", "lk-a")} and k.of_key("b") == {("link", "lk-b")}


def test_job_network_reads_through_and_serialises_in_one_form():
    plan = _plan(inbound=True)
    net = JobNetwork(plan).with_addresses(ipv4="10.0.0.2", inbound_port=20001)
    assert net.ipv4 == "10.0.0.2" and net.inbound is True and net.job_id == "7.0" and net.has_network
    assert net.ipv6 is None and JobNetwork(plan).ipv4 is None
    d = net.to_dict()
    assert d["ipv4"] == "10.0.0.2" and d["network_type"] == "nat" and d["inbound_port"] == 20001
    assert JobNetwork.from_dict(json.loads(json.dumps(d))) == net
    assert NetworkPlan.from_dict(d) == plan  # a record's form still yields the decided plan
    assert Addresses() == JobNetwork(plan).addrs
    with pytest.raises(AttributeError):
        net.no_such_field
