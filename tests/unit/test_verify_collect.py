"""`lark status --verify`: the collection of findings per job (against the in-memory kernel), the nft read-back
against listings, and who may ask."""
import asyncio
import json
import os

import pytest
from helpers.fakekernel import fake_networker

from lark.daemon import verify as verify_mod
from lark.daemon.peercred import Peer
from lark.errors import LarkError
from lark.kernel.firewall import job_netns, nftverify
from lark.plan import NetworkPlan


def _setup(net, key="slot1", job="7.0", **kw):
    plan = NetworkPlan(job_id=job, slot=key, key=key, **kw)
    return net.setup(plan, starter_pid=os.getpid(), starter_start=1, job_pid=os.getpid(), job_ns=99)


def _verify_all(net) -> dict:
    return verify_mod.report([verify_mod.verify_job(net, k) for k in sorted(net.records.keys())])


def test_a_job_as_built_has_no_drift_and_every_object_is_counted(tmp_path, monkeypatch):
    net, _ = fake_networker(str(tmp_path), monkeypatch)
    _setup(net, rate_limit_mbit=10.0)
    _setup(net, "slot2", "8.0")
    got = _verify_all(net)
    assert got["drift"] == [] and got["jobs"] == 2 and got["not_ready"] == 0
    # netns, veth, address, nat route, job netns filter, firewall: 6 per job, and the limit of the first.
    assert got["objects"] == 6 + 6 + 1


def test_objects_removed_by_hand_are_reported_with_the_job_and_how_to_recover(tmp_path, monkeypatch):
    net, k = fake_networker(str(tmp_path), monkeypatch)
    _setup(net)
    _setup(net, "slot2", "8.0")
    k.objects -= {("link", "lk-slot1"), ("fw:nftables", "slot1")}
    got = _verify_all(net)
    assert [(r["job"], r["slot"], r["object"]) for r in got["drift"]] == [
        ("7.0", "slot1", "veth lk-slot1"), ("7.0", "slot1", "nftables rules of lk-slot1")]
    assert all("condor_vacate_job 7.0" in r["fix"] for r in got["drift"])
    assert got["jobs"] == 2


def test_a_slot_still_setting_up_is_not_checked(tmp_path, monkeypatch):
    net, k = fake_networker(str(tmp_path), monkeypatch)
    _setup(net)
    net.records.load("slot1").phase = "setting-up"
    k.objects.clear()
    got = _verify_all(net)
    assert got == {"jobs": 0, "objects": 0, "not_ready": 1, "drift": []}


def test_a_check_that_cannot_read_the_kernel_is_drift_not_a_match(tmp_path, monkeypatch):
    net, _ = fake_networker(str(tmp_path), monkeypatch)
    _setup(net)

    def broken(*a):
        raise OSError("netlink said no")
    monkeypatch.setattr(net.fw, "verify_job", broken)
    rows = _verify_all(net)["drift"]
    assert len(rows) == 1 and "could not be checked: netlink said no" in rows[0]["problem"]


def test_verify_is_for_root_only(tmp_path, monkeypatch):
    from lark.daemon import server as server_mod
    net, _ = fake_networker(str(tmp_path), monkeypatch)
    d = server_mod.Larkd(net.cfg)
    d.net, d.records = net, net.records

    async def ask(uid: int):
        d.loop = asyncio.get_running_loop()
        return json.loads(await d.dispatch({"op": "verify"}, Peer(pid=os.getpid(), uid=uid, gid=uid)))
    with pytest.raises(LarkError, match="operation verify is for root only"):
        asyncio.run(ask(1000))
    _setup(net)
    assert asyncio.run(ask(0))["jobs"] == 1


# -- nft read-back: the commands setup applies against what the kernel lists --------------------------------------
T = {"family": "inet", "table": "lark"}
CMDS = [
    {"add": {"table": {"family": "inet", "name": "lark"}}},
    {"add": {"counter": {**T, "name": "j_slot1_in"}}},
    {"add": {"chain": {**T, "name": "j_slot1_pre"}}},
    {"flush": {"chain": {**T, "name": "j_slot1_pre"}}},
    {"add": {"rule": {**T, "chain": "j_slot1_pre", "expr": [{"drop": None}]}}},
    {"add": {"rule": {**T, "chain": "j_slot1_pre", "expr": [{"accept": None}]}}},
    {"add": {"element": {**T, "name": "pre_from_job", "elem": [["lk-slot1", {"goto": {"target": "j_slot1_pre"}}]]}}},
    {"add": {"element": {**T, "name": "ovs_jobs", "elem": [{"elem": {"val": "02:AA:bb:cc:dd:ee", "comment": "x"}}]}}},
]


def _listing(drop: tuple = (), rules: int = 2, verdict: str = "j_slot1_pre") -> list[dict]:
    objs = [{"table": {"family": "inet", "name": "lark"}},
            {"counter": {**T, "name": "j_slot1_in", "packets": 0, "bytes": 0}},
            {"chain": {**T, "name": "j_slot1_pre"}},
            *[{"rule": {**T, "chain": "j_slot1_pre", "handle": i, "expr": []}} for i in range(rules)],
            {"map": {**T, "name": "pre_from_job", "elem": [["lk-slot1", {"goto": {"target": verdict}}]]}},
            {"set": {**T, "name": "ovs_jobs", "elem": [{"elem": {"val": "02:aa:bb:cc:dd:ee", "comment": "x"}}]}}]
    return [o for o in objs if next(iter(o)) not in drop]


def _run(objs):
    def run(cmd: str):
        assert cmd == "list table inet lark"   # read-only: listings, never a change
        if objs is None:
            return 1, "", "Error: No such file or directory"
        return 0, json.dumps({"nftables": objs}), ""
    return run


def _problems(objs) -> list[tuple[str, str]]:
    return [(f.object, f.problem) for f in nftverify.verify_cmds(CMDS, _run(objs)) if f.drifted]


def test_nft_objects_as_built_match():
    found = nftverify.verify_cmds(CMDS, _run(_listing()))
    assert [f for f in found if f.drifted] == [] and len(found) == 5   # counter, chain, 2 elements, pre's rules


@pytest.mark.parametrize("objs,expect", [
    (None, [("nft table inet lark", "the table is gone")]),
    (_listing(drop=("chain", "rule")), [("nft chain inet lark j_slot1_pre", "the chain is gone")]),
    (_listing(rules=0), [("nft rules of chain inet lark j_slot1_pre", "0 rule(s) where setup put 2")]),
    (_listing(drop=("counter",)), [("nft counter inet lark j_slot1_in", "the counter is gone")]),
    (_listing(verdict="j_slot2_pre"), [("nft element lk-slot1 of inet lark pre_from_job",
                                        "element lk-slot1 maps to {'goto': {'target': 'j_slot2_pre'}}, setup made it "
                                        "{'goto': {'target': 'j_slot1_pre'}}")]),
    (_listing(drop=("set",)), [("nft element 02:aa:bb:cc:dd:ee of inet lark ovs_jobs",
                                "set or map ovs_jobs is gone")]),
])
def test_nft_objects_changed_by_hand_are_named(objs, expect):
    assert _problems(objs) == expect


def test_the_job_netns_filter_is_counted_from_the_text_setup_loads():
    # input: lo, established, ICMP errors, ICMPv6, DHCPv6 replies; output: the two DHCP guards.
    assert job_netns._chains(job_netns.rules(block_inbound=True, dhcpv6_client=True)) == {"input": 5, "output": 2}
    assert job_netns._chains(job_netns.rules(block_inbound=False)) == {"output": 2}


def test_ovs_port_and_flows_are_read_back(tmp_path, monkeypatch):
    from types import SimpleNamespace

    from lark.config import Config
    from lark.kernel.attach import ovs
    from lark.kernel.sections import OvsSection
    from lark.names import JobNames
    from lark.plan import Addresses, JobNetwork
    mode = ovs.OvsMode(OvsSection.from_config(Config(run_dir=str(tmp_path),
                                                    bridge_range="192.0.2.10-192.0.2.20")))
    names = JobNames("slot1")
    job = JobNetwork(NetworkPlan(job_id="9.0", slot="slot1", key="slot1", network_type="ovs_bridge"),
                     Addresses(ipv4="192.0.2.10", ipv4_prefix=24))
    flows = ovs.pre_address_flows(names.job_mac) + ovs.allowlist_flows(job, names.job_mac)
    ports = {names.host_if}
    dumped = [f" cookie={ovs.cookie_of('slot1')}, duration=1s, table=0, n_packets=0, {f}" for f in flows]
    monkeypatch.setattr(mode.db, "bridge_ports", lambda br: ports)
    monkeypatch.setattr(mode, "ofctl", lambda *a, input=None: SimpleNamespace(
        stdout="NXST_FLOW reply (xid=0x4):\n" + "\n".join(dumped)))
    assert [f.drifted for f in mode.verify(None, 5, job, names)] == [False, False]
    dumped.pop()   # a flow deleted by hand
    assert [f.problem for f in mode.verify(None, 5, job, names) if f.drifted] == [
        f"{len(flows) - 1} flow(s) where setup put {len(flows)}"]
    ports.clear()   # the port taken off the bridge
    assert [f.problem for f in mode.verify(None, 5, job, names)] == [
        "the job's port is gone from the bridge: the job is cut off"]
