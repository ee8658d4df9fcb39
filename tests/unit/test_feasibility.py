"""Issue 24 item 3: every refusal knowable before the job starts comes from one pure function, asked by both
PREPARE_JOB's check and setup, so a job this EP cannot network is held at PREPARE_JOB and the kernel is never
touched for it."""
import asyncio
import json
import os
import shutil

import pytest
from helpers.fakekernel import fake_networker

from lark.config import Config
from lark.daemon import server as server_mod
from lark.daemon.peercred import Peer, StarterInfo, start_time
from lark.errors import LarkError
from lark.kernel.attach import make_modes
from lark.plan import NetworkPlan
from lark.realize.feasibility import check_feasible, host_profile, refusals

ME = os.getpid()
BRIDGED = {"bridge_range": "198.51.100.100-198.51.100.149", "bridge_gateway": "198.51.100.1"}
RANGE6 = {"bridge_range6": "2001:db8::100-2001:db8::1ff", "bridge_gateway6": "2001:db8::1"}


def profile(tmp_path, firewall="nftables", modes=("nat", "bridge", "ovs_bridge"), dhcpcd=True, **knobs):
    cfg = Config(run_dir=str(tmp_path / "run"), state_dir=str(tmp_path / "state"), **knobs).validate()
    return host_profile(cfg, modes, firewall, dhcpcd)


def plan(**fields) -> NetworkPlan:
    return NetworkPlan(job_id="7.0", slot="slot1", key="slot1", **fields)


def refused(p: NetworkPlan, host) -> str:
    with pytest.raises(LarkError) as e:
        check_feasible(p, host)
    assert e.value.job == "7.0"
    return str(e.value)


def test_a_vlan_on_the_linux_bridge_is_refused_and_on_ovs_it_is_not(tmp_path):
    host = profile(tmp_path, **BRIDGED)
    msg = refused(plan(network_type="bridge", vlan=10), host)
    assert "VLAN 10" in msg and "bridge mode cannot put a job on a VLAN" in msg and "ovs_bridge" in msg, msg
    check_feasible(plan(network_type="ovs_bridge", vlan=10), host)
    # A machine-wide VLAN (policies/vlan_machine.ad) with a NAT job: NAT leaves through the uplink, as before.
    check_feasible(plan(network_type="nat", vlan=10), host)


@pytest.mark.parametrize(("mode", "knobs", "fix"), [
    ("nat", {}, "set LARK_SUBNET6"),
    ("bridge", BRIDGED, "set LARK_BRIDGE_RANGE6"),
    ("ovs_bridge", BRIDGED, "set LARK_BRIDGE_RANGE6"),
])
def test_ipv6_without_a_pool_or_range_for_the_mode_is_refused(tmp_path, mode, knobs, fix):
    for protocol in ("IPv6", "IPv4+IPv6"):
        msg = refused(plan(network_type=mode, ip_protocol=protocol), profile(tmp_path, **knobs))
        assert f"the job wants IPv6 but {mode} mode has no IPv6 pool or range" in msg and fix in msg, msg
    check_feasible(plan(network_type=mode, ip_protocol="IPv4"), profile(tmp_path, **knobs))


@pytest.mark.parametrize(("mode", "knobs"), [
    ("nat", {"subnet6": "fd00:213::/64"}),
    ("bridge", {**BRIDGED, **RANGE6}),
    ("bridge", {**BRIDGED, "bridge_ipv6": "slaac"}),
    ("ovs_bridge", {**BRIDGED, "bridge_ipv6": "dhcpv6"}),
])
def test_ipv6_with_a_source_for_the_mode_is_feasible(tmp_path, mode, knobs):
    check_feasible(plan(network_type=mode, ip_protocol="IPv4+IPv6"), profile(tmp_path, **knobs))


def test_dhcpv6_without_dhcpcd_is_refused(tmp_path):
    knobs = {**BRIDGED, "bridge_ipv6": "dhcpv6"}
    msg = refused(plan(network_type="bridge", ip_protocol="IPv6"), profile(tmp_path, dhcpcd=False, **knobs))
    assert "dhcpcd is not installed" in msg and "dhcpcd-base" in msg, msg
    check_feasible(plan(network_type="bridge", ip_protocol="IPv4"), profile(tmp_path, dhcpcd=False, **knobs))


def test_the_iptables_backend_refuses_linux_bridge_jobs_and_ipv6_jobs_it_cannot_filter(tmp_path):
    host = profile(tmp_path, firewall="iptables", subnet6="fd00:213::/64", **BRIDGED, **RANGE6)
    msg = refused(plan(network_type="bridge"), host)
    assert "firewall = iptables" in msg and "bridge mode needs the nftables firewall backend" in msg, msg
    msg = refused(plan(network_type="nat", ip_protocol="IPv4+IPv6"), host)
    assert "IPv6 jobs in nat mode need the nftables firewall backend" in msg, msg
    # What this backend does filter: routed IPv4, and OVS jobs (OpenFlow, outside netfilter) in both families.
    check_feasible(plan(network_type="nat"), host)
    check_feasible(plan(network_type="ovs_bridge", ip_protocol="IPv4+IPv6"), host)
    check_feasible(plan(network_type="bridge", ip_protocol="IPv4+IPv6"), profile(tmp_path, **BRIDGED, **RANGE6))


def test_a_mode_this_ep_does_not_offer_is_refused_naming_what_it_offers(tmp_path):
    msg = refused(plan(network_type="ovs_bridge", vlan=5), profile(tmp_path, modes=("nat", "bridge"), **BRIDGED))
    assert "'ovs_bridge' is not available" in msg and "offers nat, bridge, none" in msg, msg
    assert "VLAN" not in msg  # nothing about a mode that is not here


def test_every_refusal_is_named_at_once_and_a_job_without_network_needs_nothing(tmp_path):
    host = profile(tmp_path, firewall="iptables", **BRIDGED)
    p = plan(network_type="bridge", vlan=10, ip_protocol="IPv4+IPv6")
    assert len(refusals(p, host)) == 4
    msg = refused(p, host)
    assert msg.startswith("job 7.0: bridge network on this execution point: 4 reasons: "), msg
    for part in ("VLAN 10", "no IPv6 pool", "bridge mode needs the nftables", "IPv6 jobs in bridge mode"):
        assert part in msg, (part, msg)
    assert "\n" not in msg  # a hold reason is one line
    check_feasible(plan(network_type="none", vlan=10, ip_protocol="IPv6"), profile(tmp_path, modes=()))


@pytest.mark.parametrize("knobs", [{}, {"subnet6": "fd00:213::/64"}, BRIDGED, {**BRIDGED, **RANGE6},
                                   {**BRIDGED, "bridge_ipv6": "slaac"}, {**BRIDGED, "bridge_ipv6": "dhcpv6"}])
def test_the_profile_says_what_the_real_attach_modes_do(tmp_path, knobs, monkeypatch):
    """Setup relies on the check for IPv6 (it no longer tests for a pool itself): the profile must say a mode
    has IPv6 from a pool exactly when the mode made one, and be bridged exactly when the mode is."""
    monkeypatch.setattr(shutil, "which", lambda name: "/usr/bin/" + name)  # OVS mode made without OVS here
    cfg = Config(run_dir=str(tmp_path / "run"), state_dir=str(tmp_path / "state"), ovs_db="unix:/nonexistent",
                 **knobs).validate()
    modes = make_modes(cfg)
    host = host_profile(cfg, modes, "nftables", True)
    assert [m.name for m in host.modes] == list(modes)
    for name, mode in modes.items():
        got = host.mode(name)
        assert got is not None and got.bridged == mode.bridged
        assert (got.ipv6 == "pool") == (mode.pool6 is not None), (name, got)


# -- the daemon: PREPARE_JOB's check and setup ask the same function ------------------------------------------
def daemon(tmp_path, monkeypatch, decided: NetworkPlan):
    net, k = fake_networker(str(tmp_path), monkeypatch, ad_source="files", ad_dir=str(tmp_path / "ads"))
    d = server_mod.Larkd(net.cfg)
    d.fw, d.net, d.records, d.acct, d.finished = net.fw, net, net.records, net.acct, net.finished
    starter = StarterInfo(pid=ME, start=start_time(ME), slot="slot1", exe="/usr/sbin/condor_starter", argv=[])
    monkeypatch.setattr(server_mod.peercred, "authorize_job", lambda who, paths, *inodes: (starter, 4242))
    monkeypatch.setattr(server_mod.peercred, "starter_of", lambda who, paths: starter)
    monkeypatch.setattr(d, "plan_for", lambda st, key: decided)
    asked = []
    real = net.check_feasible
    monkeypatch.setattr(net, "check_feasible", lambda p: asked.append(p) or real(p))
    return d, k, asked


def ask(d, op: str) -> dict:
    async def main():
        d.loop = asyncio.get_running_loop()
        return json.loads(await d.dispatch({"op": op}, Peer(pid=ME, uid=1000, gid=1000)))
    return asyncio.run(main())


def test_check_and_setup_refuse_an_infeasible_job_with_the_same_reason_and_touch_nothing(tmp_path, monkeypatch):
    """The fake EP has NAT without IPv6: a dual-stack job is refused by the check, and a setup that comes without
    one (larkd restarted in between) refuses it the same way before a record or a kernel object exists."""
    decided = NetworkPlan(job_id="7.0", slot="slot1", key="slot1", ip_protocol="IPv4+IPv6")
    d, k, asked = daemon(tmp_path, monkeypatch, decided)
    with pytest.raises(LarkError) as at_check:
        ask(d, "check")
    assert "the job wants IPv6 but nat mode has no IPv6 pool" in str(at_check.value)
    # counted as a refusal of the plan (lark_failures_total{reason="policy"}, the LarkJobsRefused alert's input)
    assert getattr(at_check.value, "metric_reason", None) == "policy"
    d.jobs.get("slot1").check = None   # the check's decision is not reused: setup decides again
    with pytest.raises(LarkError) as at_setup:
        ask(d, "setup")
    assert str(at_setup.value) == str(at_check.value)
    assert asked == [decided, decided]
    assert k.calls == [] and d.records.keys() == [] and d.active == set()


def test_a_feasible_job_passes_the_check_and_is_built(tmp_path, monkeypatch):
    decided = NetworkPlan(job_id="7.0", slot="slot1", key="slot1")
    d, k, asked = daemon(tmp_path, monkeypatch, decided)
    assert ask(d, "check")["ok"]
    built = ask(d, "setup")
    for job in d.jobs:  # the fake starter is this test process: do not wait for it to exit
        if job.watch is not None:
            os.close(job.watch)
    assert built["ok"] and built["plan"]["ipv4"] and asked == [decided, decided]
    assert "links.create_veth" in k.calls
