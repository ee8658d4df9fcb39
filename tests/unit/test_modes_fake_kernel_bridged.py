"""The bridged modes (bridge, ovs_bridge) with what only they do, on the fake kernel (tests/helpers/fakekernel.py):
an IPv4 lease from the site's DHCP server, IPv6 by SLAAC or by a DHCPv6 client in the job's netns, a SciTag with
its firefly reporter, and an IPv6 DNS relay. Through the real resource list, engine, records, pools and lease
cache: setup builds each piece and teardown removes all of them; a failure right after any resource of the
bridged profile did its work, or at any kernel step, leaves nothing of the job and names it.
"""
from __future__ import annotations

import os

import pytest
from helpers.fakekernel import FakeKernel, fake_networker

from lark.daemon.jobnet import JobNetworker
from lark.errors import LarkError
from lark.plan import NetworkPlan

MODES = ("bridge", "ovs_bridge")
PREFIX = {"bridge": "bridge", "ovs_bridge": "ovs"}
TAG = (5 << 6) | 2   # SciTags experiment 5, activity 2
# Per variant: the job's plan fields and the EP's configuration.
VARIANTS: dict[str, tuple[dict, dict]] = {
    "dhcp": ({"address_type": "dhcp"}, {"dhcp_release": True}),
    "slaac": ({"ip_protocol": "IPv4+IPv6"}, {"bridge_ipv6": "slaac"}),
    "dhcpv6": ({"ip_protocol": "IPv4+IPv6"}, {"bridge_ipv6": "dhcpv6"}),
    "scitag": ({"scitag": TAG}, {"scitags_collector": "192.0.2.99:10514"}),
}
# Everything at once: the job whose every resource has work to do.
ALL = ({"address_type": "dhcp", "ip_protocol": "IPv4+IPv6", "scitag": TAG},
       {"dhcp_release": True, "bridge_ipv6": "dhcpv6", "scitags_collector": "192.0.2.99:10514"})
READS = {"links.link_stats", "nftables.verify_job"}


def _networker(tmp: str, mode: str, cfg: dict) -> tuple[JobNetworker, FakeKernel]:
    net, k = fake_networker(tmp, modes=(mode,), **cfg)
    k.loopback_ns6 = True   # ::1 in the host's resolv.conf: each job also gets an IPv6 DNS relay
    return net, k


def _setup(net: JobNetworker, mode: str, plan_fields: dict, key: str = "slot1"):
    plan = NetworkPlan(job_id="7.0", slot=key, key=key, network_type=mode, rate_limit_mbit=10.0, **plan_fields)
    return net.setup(plan, os.getpid(), 1, os.getpid(), 99)


def _nothing_left(net: JobNetworker, k: FakeKernel, mode: str, key: str = "slot1") -> None:
    assert k.of_key(key) == set()
    assert not any(kind == "dhcp-lease" for kind, _ in k.objects)   # the site's DHCP server holds nothing
    assert net.records.keys() == []
    assert list(net.modes[mode].pool.entries()) == [] and list(net.ports.entries()) == []
    assert net.leases.get(key) is None
    assert net.engine.keys() == {}  # gc finds nothing either


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("mode", MODES)
def test_a_bridged_job_gets_its_site_addressing_or_tag_and_teardown_removes_all_of_it(tmp_path, mode, variant):
    plan_fields, cfg = VARIANTS[variant]
    net, k = _networker(str(tmp_path), mode, cfg)
    rec = _setup(net, mode, plan_fields)
    assert rec.phase == "ready"
    saved = net.records.load("slot1").plan   # what teardown and gc will read
    assert ("link", "lk-slot1") in k.objects and (f"{mode}-filter", "slot1") in k.objects
    assert ("dns6-relay", "lark-slot1") in k.objects
    if variant == "dhcp":
        assert saved["ipv4"].startswith("198.51.100.") and saved["gateway4"] == "198.51.100.1"
        assert saved["dhcp"]["server"] == "198.51.100.2"
        assert ("dhcp-lease", f"{saved['ipv4']}/lk-slot1") in k.objects
        assert list(net.modes[mode].pool.entries()) == []   # no address of bridge_range taken
    else:
        assert saved["ipv4"] == "192.0.2.10" and not saved.get("dhcp")
    if variant == "slaac":
        assert saved["ipv6"] == "2001:db8:5::a" and saved["ipv6_prefix"] == 64
        assert "ipv6auto.prepare" in k.calls and "ipv6auto.wait_for_slaac" in k.calls
    if variant == "dhcpv6":
        assert saved["ipv6"] == "2001:db8:5::d" and ("dhcpv6-client", "slot1") in k.objects
    if variant == "scitag":
        assert saved["scitag"] == TAG and "scitags.secure" in k.calls and ("fireflies", "slot1") in k.objects
    k.calls.clear()
    net.teardown("slot1", "job finished")
    _nothing_left(net, k, mode)
    assert k.objects == {(f"{mode}-shared", "host")}  # only the EP's own bridge stays
    expected = {"dhcp": "dhcp.release", "dhcpv6": "dhcp6.stop", "scitag": "fireflies.finish", "slaac": "netns.detach"}
    assert expected[variant] in k.calls
    if variant in ("dhcpv6", "scitag"):   # processes and readers in the netns go before it
        assert k.calls.index(expected[variant]) < k.calls.index("netns.detach")


@pytest.mark.parametrize("mode", MODES)
def test_a_failure_after_any_resource_of_the_bridged_profile_leaves_nothing_of_the_job(tmp_path, mode):
    resources = _networker(str(tmp_path / "probe"), mode, ALL[1])[0].profiles[mode].resources
    assert {"dhcp-lease", "address", "scitags", "dns"} <= set(resources)
    for name in resources:
        net, k = _networker(str(tmp_path / name), mode, ALL[1])
        k.fail.add(f"{name}.added")
        with pytest.raises(LarkError, match=f"job 7.0: slot slot1: setup failed: injected failure of {name}.added"):
            _setup(net, mode, ALL[0])
        assert f"{name}.added" in k.calls, f"{name} was never added"
        _nothing_left(net, k, mode)


@pytest.mark.parametrize("ipv6", ["slaac", "dhcpv6"])
@pytest.mark.parametrize("mode", MODES)
def test_a_failure_at_any_kernel_step_of_a_bridged_job_leaves_nothing_of_it(tmp_path, mode, ipv6):
    cfg = {**ALL[1], "bridge_ipv6": ipv6}
    net, k = _networker(str(tmp_path / "probe"), mode, cfg)
    _setup(net, mode, ALL[0])
    steps = [c for c in dict.fromkeys(k.calls) if c not in READS and not c.endswith(".added")]
    wanted = {"dhcp.acquire", "scitags.secure", "fireflies.watch", "dns.setup_job", f"{PREFIX[mode]}.attach"}
    wanted.add("ipv6auto.wait_for_slaac" if ipv6 == "slaac" else "dhcp6.acquire")
    assert wanted <= set(steps), steps
    for i, step in enumerate(steps):
        net, k = _networker(str(tmp_path / f"s{i}"), mode, cfg)
        k.fail.add(step)
        with pytest.raises(LarkError, match=f"job 7.0: slot slot1: setup failed: injected failure of {step}"):
            _setup(net, mode, ALL[0])
        _nothing_left(net, k, mode)


@pytest.mark.parametrize("mode", MODES)
def test_gc_finds_a_bridged_orphans_processes_and_lease_holders_and_removes_them(tmp_path, mode):
    net, k = _networker(str(tmp_path), mode, ALL[1])
    _setup(net, mode, ALL[0], "live")
    _setup(net, mode, ALL[0], "dead")
    os.unlink(os.path.join(net.cfg.records_dir, "dead.json"))  # a crash after the kernel work, before any record
    from lark.daemon.sweep import find_orphans, sweep
    found = find_orphans(net, keep={"live"}, others=[])
    assert {"DHCPv6 client", "IPv6 DNS relay", f"{mode} port"} <= set(found["dead"]), found
    sweep(net, keep={"live"}, others=[])
    # Without its record gc cannot know the orphan's lease (the slot's lease cache keeps it for its next job).
    assert {kind for kind, _ in k.of_key("dead")} <= {"dhcp-lease"}
    assert k.of_key("live") and net.records.keys() == ["live"]


@pytest.mark.parametrize("mode", MODES)
def test_a_running_dhcp_jobs_lease_is_renewed_when_due_and_not_before(tmp_path, mode):
    net, k = _networker(str(tmp_path), mode, VARIANTS["dhcp"][1])
    rec = _setup(net, mode, VARIANTS["dhcp"][0])
    net.renew_leases({"slot1"})
    assert "dhcp.renew" not in k.calls              # a fresh lease: T1 is half an hour away
    rec.renewed_lease = {**rec.lease, "obtained": rec.lease["obtained"] - 2000}  # past T1 (1800 s)
    net.renew_leases({"slot1"})
    assert k.calls.count("dhcp.renew") == 1
    assert net.records.load("slot1").lease["obtained"] > rec.created - 1
    assert rec.plan["dhcp"]["obtained"] > rec.created - 1   # setup's lease: the plan is not changed
    assert net.leases.get("slot1").address == rec.plan["ipv4"]
