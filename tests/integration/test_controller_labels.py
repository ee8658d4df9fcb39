"""The label scheme (issue 26, `[labels] mode = "vlan"`) on a real OVS (userspace datapath, private OVS_RUNDIR) with the
real controller: each "EP" is an OVS bridge of its own (edge1, edge2) whose uplink is a patch port to the core switch,
running lark.controller.labels.edge_flows for its jobs with the label each registration answered. The core holds
only the controller's per-EP and per-WAN-action flows, and per-job entries only for a drop policy that names a job."""
import shutil
import tempfile

import pytest
from helpers.frames import frame_arrives
from helpers.sdn import BRIDGE, DROP_MALLORY, GW, SLICE_AND_WAN_POLICIES, WAN_SERVER, sh, started_pool

from lark.controller import labels
from lark.controller.model import JobReg

pytestmark = pytest.mark.skipif(not shutil.which("ovs-vswitchd"), reason="Open vSwitch is not installed")

# the label scheme with the two EPs' ports and address ranges
LABELS_AND_EPS = """
[labels]
mode = "vlan"
[ep.ep1]
ports = ["pe1"]
addresses = ["10.77.1.16/28"]
[ep.ep2]
ports = ["pe2"]
addresses = ["10.77.1.32/28"]
"""
# the paper's policies (drop mallory, per-user slices, students off the WAN, cms steered) and a drop naming one job
POLICIES = DROP_MALLORY + SLICE_AND_WAN_POLICIES + """
[[policy]]
name = "one-job"
kind = "drop"
select = 'LarkJobId == "34.0"'
""" + LABELS_AND_EPS
EDGES = {"ep1": ("edge1", "pe1", "pc1"), "ep2": ("edge2", "pe2", "pc2")}   # EP -> its bridge, core port, uplink


@pytest.fixture
def pool(tmp_path, request):
    yield from started_pool(str(tmp_path), getattr(request, "param", POLICIES))


def make_edges(pool) -> None:
    for bridge, core_port, uplink in EDGES.values():
        pool.ovs.vsctl("add-br", bridge, "--", "set", "bridge", bridge, "datapath_type=netdev",
                       "protocols=OpenFlow13", "fail_mode=secure")
        pool.ovs.vsctl("add-port", BRIDGE, core_port, "--", "set", "interface", core_port, "type=patch",
                       f"options:peer={uplink}")
        pool.ovs.vsctl("add-port", bridge, uplink, "--", "set", "interface", uplink, "type=patch",
                       f"options:peer={core_port}")


def add_job(pool, name: str, ep: str, owner: str, n: int, group: str = "") -> None:
    """A job namespace on a port of its EP's bridge (not on the core), listening on 9000."""
    ns, port = f"lark-sdn-{pool.id}-{name}", f"j{n}-{pool.id}"
    pool._netns(ns)
    mac, ip = f"02:77:00:{n:02x}:00:02", f"10.77.1.{n}"
    sh(["ip", "link", "add", port, "netns", pool.core, "type", "veth", "peer", "name", "eth0", "netns", ns])
    sh(["ip", "-n", ns, "link", "set", "eth0", "address", mac])
    sh(["ip", "-n", ns, "addr", "add", f"{ip}/16", "dev", "eth0"])
    sh(["ip", "-n", ns, "link", "set", "eth0", "up"])
    sh(["ip", "-n", ns, "route", "add", "default", "via", GW])
    sh(["ip", "-n", pool.core, "link", "set", port, "up"])
    pool.ovs.vsctl("add-port", EDGES[ep][0], port)
    pool.serve(ns, 9000)
    pool.jobs[name] = {"ns": ns, "ep": ep, "port": port,
                       "reg": {"key": f"slot-{name}", "job_id": f"{n}.0", "owner": owner,
                               "accounting_group": group, "addresses": [ip], "mac": mac}}


def program_edge(pool, ep: str, labelled: dict[str, tuple[int, int]]) -> None:
    """The EP's part: its jobs' flows with their labels (what larkd does on an EP switch in this scheme)."""
    bridge, _, uplink = EDGES[ep]
    rows = [(JobReg.from_wire(j["reg"], ep), *labelled[name], j["port"])
            for name, j in pool.jobs.items() if j["ep"] == ep and name in labelled]
    with tempfile.NamedTemporaryFile("w", suffix=".flows") as f:
        f.write("\n".join(labels.edge_flows(rows, uplink)) + "\n")
        f.flush()
        sh(["ovs-ofctl", "-O", "OpenFlow13", "replace-flows", f"unix:{pool.ovs.dir}/{bridge}.mgmt", f.name])


def register_all(pool) -> dict[str, tuple[int, int]]:
    got = {}
    for name in pool.jobs:
        code, body = pool.register(name)
        assert code == 200 and body["switches"] == 1, body
        got[name] = (body["label"]["vid"], body["label"]["pcp"])
    for ep in EDGES:
        program_edge(pool, ep, got)
    return got


def test_owner_policies_hold_with_label_flows_and_per_job_entries_only_where_a_policy_names_a_job(pool):
    make_edges(pool)
    for name, ep, owner, n, group in (("alice1", "ep1", "alice", 20, ""), ("bob", "ep1", "bob", 21, ""),
                                      ("mallory", "ep1", "mallory", 22, ""), ("carol", "ep1", "carol", 23, "students"),
                                      ("alice2", "ep2", "alice", 33, ""), ("dave", "ep2", "dave", 34, "")):
        add_job(pool, name, ep, owner, n, group)
    got = register_all(pool)
    assert got["alice1"] == got["alice2"] and got["alice1"][0] not in (labels.COMMON_VID, labels.BLOCKED_VID)
    assert got["mallory"] == (labels.BLOCKED_VID, 0) and got["dave"] == (labels.BLOCKED_VID, 0)
    assert got["carol"][1] == 1 and got["bob"][0] != got["alice1"][0]
    ip = pool.ip
    # a slice across EPs: the same owner's jobs reach each other, another owner's do not, either way
    assert pool.connects("alice1", ip("alice2")) and pool.connects("alice2", ip("alice1"))
    assert not pool.connects("bob", ip("alice2")) and not pool.connects("alice2", ip("bob"))
    # the untagged domain: the router (site) and the WAN behind it
    assert pool.connects("alice1", GW, 7000) and pool.connects("bob", WAN_SERVER, 7000)
    # a dropped owner's job reaches nothing and nothing reaches it; another owner's job does
    assert not pool.connects("mallory", GW, 7000) and not pool.connects("mallory", ip("alice2"))
    assert not pool.connects("alice2", ip("mallory"))
    # the WAN action rides in the label's priority bits: carol reaches the site but not the WAN
    assert pool.connects("carol", GW, 7000) and not pool.connects("carol", WAN_SERVER, 7000)
    # the job a policy names: dropped, with its own entries on the core; nobody else has any
    assert not pool.connects("dave", GW, 7000) and not pool.connects("alice2", ip("dave"))
    st = pool.api("GET", "/v1/status", cert="controller")[1]
    per_job = {j["key"]: j["flows"] for j in st["jobs"]}
    assert per_job == {"slot-alice1": 0, "slot-bob": 0, "slot-mallory": 0, "slot-carol": 0, "slot-alice2": 0,
                       "slot-dave": 2}, per_job
    job_flows = [f for f in pool.flows() if "cookie=0x4a" in f]
    assert len(job_flows) == 2 and all("dl_src=02:77:00:22:00:02" in f or "dl_dst=02:77:00:22:00:02" in f
                                       for f in job_flows), job_flows
    # the core's own label flows: 2 per EP port (IPv4, ARP) and a constant number more, survived reconciliation
    mine = [f for f in pool.flows() if "dl_vlan" in f or "vlan_tci" in f]
    assert len([f for f in mine if "arp_spa=" in f or "nw_src=" in f]) == 4, mine
    # a restarted controller finds its label flows as it configures them (its reconciliation removes none)
    def base():   # the controller's own flows (the jobs' come back with their EPs' resync, not made here)
        return sorted(f.split(" priority=")[1].split(" ")[0] + " " + f.split(" actions=")[1] for f in pool.flows()
                      if "cookie=0x4c41524b00000000" in f)
    before = base()
    pool.kill_controller()
    pool.start_controller()
    pool.wait_switch()
    assert "no longer configured" not in pool.log()
    assert base() == before and len(before) > 20
    assert pool.connects("alice1", ip("alice2")) and not pool.connects("bob", ip("alice2"))


def test_a_label_from_the_wrong_port_is_dropped(pool):
    """A compromised EP 2 labels a job of its own with alice's slice: with an address of EP 1's range it is dropped
    at the core (port and range do not match); with one of its own range it gets in (the control: the core trusts
    each EP with its own jobs' labels, as it trusts its registrations' owners)."""
    make_edges(pool)
    add_job(pool, "alice1", "ep1", "alice", 20)
    add_job(pool, "eve", "ep2", "eve", 25)          # 10.77.1.25 lies in ep1's range, behind ep2's port
    add_job(pool, "eve2", "ep2", "eve", 40)         # 10.77.1.40: ep2's own range
    code, body = pool.register("alice1")
    assert code == 200, body
    alice = (body["label"]["vid"], body["label"]["pcp"])
    code, body = pool.register("eve")
    assert code == 403 and "not one of this EP's" in body.get("error", str(body)), body   # the registry refuses it
    program_edge(pool, "ep1", {"alice1": alice})
    program_edge(pool, "ep2", {"eve": alice, "eve2": alice})   # the forged labels, unregistered
    assert not pool.connects("eve", pool.ip("alice1"))
    assert pool.connects("eve2", pool.ip("alice1"))
    drops = [f for f in pool.flows() if f"priority={labels.P_TAGGED_FOREIGN}," in f]
    assert drops and any("n_packets=0" not in f for f in drops), drops

# alice's jobs in a slice, bob's in none (COMMON_VID: its frames join the untagged domain at the core)
ALICE_SLICED = """
[[policy]]
name = "slices"
kind = "slice"
select = 'Owner == "alice"'
""" + LABELS_AND_EPS


@pytest.mark.parametrize("pool", [ALICE_SLICED], indirect=True)
def test_a_frame_a_job_tags_itself_reaches_no_other_slice(pool):
    """bob's job on EP 2 (in no slice) sends frames 802.1Q-tagged with alice's slice's VLAN id, from its own MAC and
    address, to alice's job on EP 1: none arrives, as its port lets out only untagged frames, which its own label
    then tags. The core here parses both tags of a double-tagged frame (`vlan-limit=0`, as a hardware switch may):
    had bob's port let its own tag through under its label, the core would pop the outer tag (bob's COMMON_VID)
    and switch the frame by the inner one, into alice's slice. The control: the same frame untagged, from alice's
    job on EP 2, arrives."""
    pool.ovs.vsctl("set", "Open_vSwitch", ".", "other_config:vlan-limit=0")
    make_edges(pool)
    for name, ep, owner, n in (("alice1", "ep1", "alice", 20), ("alice2", "ep2", "alice", 33),
                               ("bob", "ep2", "bob", 34)):
        add_job(pool, name, ep, owner, n)
    got = register_all(pool)
    assert got["alice1"][0] == got["alice2"][0] != labels.COMMON_VID and got["bob"][0] == labels.COMMON_VID, got
    ns = {name: j["ns"] for name, j in pool.jobs.items()}
    assert frame_arrives(ns["alice2"], ns["alice1"], 0)
    assert not frame_arrives(ns["bob"], ns["alice1"], got["alice1"][0]), "a frame bob tagged crossed into alice's slice"
