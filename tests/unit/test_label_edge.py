"""The label scheme on an EP's switch (issue 26): lark.labelflows is the one source of the EP's label flows (larkd's
OVS bridge and the controller's edge_flows), same-EP delivery and multicast obey the labels, and larkd applies and
removes a job's label in one ovs-ofctl call that keeps the job's cookie."""
import subprocess

from lark import labelflows
from lark.config import Config
from lark.controller import labels
from lark.controller.model import JobReg
from lark.kernel.attach import ovs
from lark.kernel.sections import OvsSection
from lark.names import JobNames
from lark.plan import Addresses, JobNetwork, NetworkPlan

UP = "up0"
HOST_MAC = "02:aa:00:00:00:01"


def edge(mac_byte: int, port: int, vid: int) -> labelflows.EdgeJob:
    mac = f"02:00:00:00:00:{mac_byte:02x}"
    return labelflows.EdgeJob(mac, port, vid, 0, labelflows.own_up(mac, [f"10.0.0.{mac_byte}"], []))


def delivered_to(flows: list[str], table1: str) -> list[str]:
    """The table-1 flows whose match has all of `table1` (comma-separated fields) and that output somewhere."""
    want = table1.split(",")
    return [f for f in flows if f.startswith(f"table={labelflows.LABEL_TABLE},") and all(w in f for w in want)
            and "output:" in f.split("actions=")[1]]


def test_same_ep_delivery_obeys_the_labels():
    alice, alice2, bob, common, mallory = (edge(1, 11, 5), edge(2, 12, 5), edge(3, 13, 6), edge(4, 14, 1),
                                           edge(5, 15, labelflows.BLOCKED_VID))
    jobs = [alice, alice2, bob, common, mallory]
    flows = labelflows.edge_flows(jobs, UP, HOST_MAC)
    # unicast: a frame labelled V reaches a job's MAC only from its own VLAN or the common one
    for j in (alice, bob):
        got = {f.split("dl_vlan=")[1].split(",")[0] for f in delivered_to(flows, f"dl_dst={j.mac}")}
        assert got == {str(j.vid), "1"}, got
        assert f"table=1,priority=90,dl_dst={j.mac},actions=drop" in flows   # any other label: dropped, not sent up
    assert delivered_to(flows, f"dl_dst={mallory.mac}") == []            # nothing reaches a blocked job
    assert f"table=1,priority=110,dl_vlan=4094,actions=output:{UP}" in flows   # a blocked job reaches only the uplink
    # multicast: up, to the host, and to the jobs its label may reach; none for the blocked VLAN
    mcast = {f.split("dl_vlan=")[1].split(",")[0]: f.split("actions=")[1] for f in flows
             if f.startswith("table=1,priority=50,")}
    assert mcast == {"5": f"output:{UP},pop_vlan,LOCAL,output:11,output:12",
                     "6": f"output:{UP},pop_vlan,LOCAL,output:13",
                     "1": f"output:{UP},pop_vlan,LOCAL,output:11,output:12,output:13,output:14"}, mcast
    down = {f.split("dl_vlan=")[1].split(",")[0]: f.split("actions=")[1] for f in flows
            if f.startswith(f"priority={labelflows.P_DOWN_MULTICAST},")}
    assert down["5"] == "pop_vlan,output:11,output:12" and down["6"] == "pop_vlan,output:13", down
    # only untagged frames from a job's own MAC and address get its label (a tag of its own matches no twin)
    twins = [f for f in flows if f"in_port={bob.port}," in f and "push_vlan" in f]
    assert twins and all(",vlan_tci=0," in f and f"dl_src={bob.mac}" in f for f in twins), twins


def test_the_controllers_edge_flows_and_larkds_are_the_same_source():
    mac, port, vid, pcp = "02:77:00:14:00:02", 7, 9, 1
    job = JobReg.from_wire({"key": "slot-a", "job_id": "20.0", "owner": "alice", "accounting_group": "",
                            "addresses": ["10.77.1.20"], "mac": mac}, "ep1")
    assert labels.edge_flows([(job, vid, pcp, "p7")], "pc1") == labelflows.edge_flows(
        [labelflows.EdgeJob(mac, "p7", vid, pcp, labelflows.own_up(mac, ["10.77.1.20"], []))], "pc1", normal=False)
    plan = JobNetwork(NetworkPlan(job_id="20.0", slot="slot1", key="slot1", network_type="ovs_bridge"),
                      Addresses(ipv4="10.77.1.20", ipv4_prefix=24))
    assert ovs.label_flows(plan, mac, port, UP, vid, pcp) == labelflows.job_flows(
        labelflows.EdgeJob(mac, port, vid, pcp, ovs.label_up(plan, mac)), UP)
    # larkd's twins: each allowlist NORMAL flow, one priority above it
    assert [p for p, _ in ovs.label_up(plan, mac)] == [101, 101]


class FakeIPRoute:
    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False

    def link_lookup(self, ifname):
        return [7]

    def get_links(self, idx):
        class Link:
            def get_attr(self, name):
                return HOST_MAC
        return [Link()]


def larkd_mode(tmp_path, monkeypatch, dump: str = ""):
    mode = ovs.OvsMode(OvsSection.from_config(Config(run_dir=str(tmp_path), bridge_range="192.0.2.10-192.0.2.20",
                                                    ovs_uplink=UP)))
    calls: list[tuple[list[str], str | None]] = []

    def run_tool(argv, *, input=None, what, check=True, timeout=30):
        calls.append((argv, input))
        return subprocess.CompletedProcess(argv, 0, stdout=dump if "dump-flows" in argv else "", stderr="")
    monkeypatch.setattr(ovs, "run_tool", run_tool)
    monkeypatch.setattr(ovs, "IPRoute", FakeIPRoute)
    ports = {"lk-slot1": 1000, "lk-slot2": 1001}
    monkeypatch.setattr(mode.db, "wait_ofport", lambda name, job_id: ports[name])
    return mode, calls


def job(slot: str, ip: str) -> tuple[JobNetwork, JobNames]:
    return (JobNetwork(NetworkPlan(job_id=f"{slot[-1]}.0", slot=slot, key=slot, network_type="ovs_bridge"),
                       Addresses(ipv4=ip, ipv4_prefix=24)), JobNames(slot))


def test_larkd_applies_a_label_in_one_ovs_ofctl_call_under_the_jobs_cookie(tmp_path, monkeypatch):
    mode, calls = larkd_mode(tmp_path, monkeypatch)
    (p1, n1), (p2, n2) = job("slot1", "192.0.2.10"), job("slot2", "192.0.2.11")
    assert mode.apply_label(p1, n1, 5, 0)
    # the first label after a larkd start also reads the bridge's table 1 once (the jobs it labelled before)
    assert [a[a.index("dump-flows")] for a, _ in calls[:-1]] == ["dump-flows"], calls
    calls.clear()
    assert mode.apply_label(p2, n2, 6, 0)
    assert len(calls) == 1, [a for a, _ in calls]
    argv, lines = calls[0]
    assert "--bundle" in argv and "add-flows" in argv and lines is not None
    c2 = ovs.cookie_of("slot2")
    mine = [line for line in lines.splitlines() if line.startswith(f"cookie={c2},")]
    assert mine and [line.split(",", 1)[1] for line in mine] == ovs.label_flows(p2, n2.job_mac, 1001, UP, 6, 0)
    # the bridge's multicast flows are rewritten whole in the same bundle, with both jobs' ports
    b = ovs.LABEL_BRIDGE_COOKIE
    assert lines.splitlines()[0] == f"delete cookie={b}/-1"
    assert any(line.startswith(f"cookie={b},table=1,priority=50,dl_vlan=5,") and line.endswith("output:1000")
               for line in lines.splitlines()), lines
    # leaving: one call, the job's cookie deleted and the multicast flows rewritten without it
    calls.clear()
    monkeypatch.setattr(mode.db, "reachable", lambda: False)
    mode.detach(n1)
    assert len(calls) == 1
    argv, lines = calls[0]
    assert lines is not None and lines.splitlines()[0] == f"delete cookie={ovs.cookie_of('slot1')}/-1"
    assert "dl_vlan=5" not in lines and "output:1000" not in lines and "dl_vlan=6" in lines


def test_a_restarted_larkd_finds_its_labelled_jobs_in_table_1(tmp_path, monkeypatch):
    p1, n1 = job("slot1", "192.0.2.10")
    flows = labelflows.job_flows(labelflows.EdgeJob(n1.job_mac, 1000, 5, 0, ovs.label_up(p1, n1.job_mac)), UP)
    c = "0x" + ovs.cookie_of("slot1")[2:].lstrip("0")
    dump = "OFPST_FLOW reply (OF1.3) (xid=0x2):\n" + "\n".join(
        f" cookie={c}, duration=3.1s, table=1, n_packets=0, n_bytes=0, "
        + f.split(",", 1)[1].replace(",actions=", " actions=") for f in flows if f.startswith("table=1,"))
    mode, calls = larkd_mode(tmp_path, monkeypatch, dump)
    p2, n2 = job("slot2", "192.0.2.11")
    assert mode.apply_label(p2, n2, 5, 0)
    lines = calls[-1][1]
    assert lines is not None and any("dl_vlan=5," in line and line.endswith("output:1000,output:1001")
                                     for line in lines.splitlines()), lines


def test_a_job_on_a_reused_port_number_replaces_the_gone_job_in_the_multicast_flows(tmp_path, monkeypatch):
    """A job that ended while larkd was down left its delivery flows (until its teardown): a new job given its port
    number must not receive the gone job's VLAN's multicast."""
    _, n1 = job("slot1", "192.0.2.10")
    c = "0x" + ovs.cookie_of("slot1")[2:].lstrip("0")
    mode, calls = larkd_mode(tmp_path, monkeypatch, f" cookie={c}, duration=3.1s, table=1, n_packets=0, n_bytes=0, "
                                                    f"priority=100,dl_vlan=5,dl_dst={n1.job_mac} "
                                                    "actions=pop_vlan,output:1001")
    p2, n2 = job("slot2", "192.0.2.11")   # gets port 1001
    assert mode.apply_label(p2, n2, 6, 0)
    lines = calls[-1][1]
    assert lines is not None and "dl_vlan=5" not in lines and "dl_vlan=6," in lines, lines
