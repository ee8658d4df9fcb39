"""The label scheme (issue 26) with jobs their EP does not tag: a Linux-bridge EP (a netns with a real Linux bridge,
its uplink is the core's port pe2) next to an OVS EP that tags its jobs (edge1, lark.controller.labels.edge_flows), on a
real OVS core (userspace datapath, private OVS_RUNDIR) run by the real controller. larkd registers a Linux-bridge job
with `"tagged": false` (lark/daemon/controller_client.py registration); the controller then gives it the per-job
flows on the core instead of a label. Without them its frames pass the core untagged, as a host's: a dropped owner's
job reaches the router, the WAN host reaches it, and a sliced job's frames reach a labelled job of another slice."""
import shutil

import pytest
from helpers.frames import frame_arrives
from helpers.sdn import DROP_MALLORY_AND_SLICES, GW, PY, sh, started_pool
from test_controller_labels import EDGES, LABELS_AND_EPS, add_job, program_edge

from lark.controller import labels

pytestmark = pytest.mark.skipif(not shutil.which("ovs-vswitchd"), reason="Open vSwitch is not installed")

POLICIES = DROP_MALLORY_AND_SLICES + LABELS_AND_EPS


@pytest.fixture
def pool(tmp_path):
    yield from started_pool(str(tmp_path), POLICIES)


def linux_bridge_ep(pool) -> str:
    """EP 2 as on the pool testbed: a netns with a Linux bridge, its uplink the core's port pe2."""
    ns = f"lark-sdn-{pool.id}-lbep"
    pool._netns(ns)
    sh(["ip", "-n", ns, "link", "add", "br0", "type", "bridge", "stp_state", "0", "forward_delay", "0"])
    sh(["ip", "link", "add", "pe2", "netns", pool.core, "type", "veth", "peer", "name", "up0", "netns", ns])
    sh(["ip", "-n", ns, "link", "set", "up0", "master", "br0", "up"])
    sh(["ip", "-n", ns, "link", "set", "br0", "up"])
    sh(["ip", "-n", pool.core, "link", "set", "pe2", "up"])
    pool.ovs.vsctl("add-port", "core", "pe2")
    return ns


def bridge_job(pool, ep_ns: str, name: str, owner: str, n: int) -> None:
    """A job on the EP's Linux bridge, listening on 9000."""
    ns, port = f"lark-sdn-{pool.id}-{name}", f"j{n}"
    pool._netns(ns)
    mac, ip = f"02:77:00:{n:02x}:00:02", f"10.77.1.{n}"
    sh(["ip", "link", "add", port, "netns", ep_ns, "type", "veth", "peer", "name", "eth0", "netns", ns])
    sh(["ip", "-n", ns, "link", "set", "eth0", "address", mac])
    sh(["ip", "-n", ns, "addr", "add", f"{ip}/16", "dev", "eth0"])
    sh(["ip", "-n", ns, "link", "set", "eth0", "up"])
    sh(["ip", "-n", ns, "route", "add", "default", "via", GW])
    sh(["ip", "-n", ep_ns, "link", "set", port, "master", "br0", "up"])
    pool.serve(ns, 9000)
    pool.jobs[name] = {"ns": ns, "ep": "ep2", "port": port,
                       "reg": {"key": f"slot-{name}", "job_id": f"{n}.0", "owner": owner, "accounting_group": "",
                               "addresses": [ip], "mac": mac}}


def reaches_from_wan(pool, dst: str) -> bool:
    code = ("import socket,sys\ntry:\n s=socket.create_connection((sys.argv[1],9000),timeout=1.5); "
            "print(s.recv(2).decode())\nexcept OSError as e: print('fail',e)")
    return sh(["ip", "netns", "exec", pool.wan, PY, "-c", code, dst]).stdout.strip() == "hi"


def test_policies_hold_for_jobs_their_ep_does_not_tag(pool):
    bridge, core_port, uplink = EDGES["ep1"]
    pool.ovs.vsctl("add-br", bridge, "--", "set", "bridge", bridge, "datapath_type=netdev", "protocols=OpenFlow13",
                   "fail_mode=secure")
    pool.ovs.vsctl("add-port", "core", core_port, "--", "set", "interface", core_port, "type=patch",
                   f"options:peer={uplink}")
    pool.ovs.vsctl("add-port", bridge, uplink, "--", "set", "interface", uplink, "type=patch",
                   f"options:peer={core_port}")
    lb = linux_bridge_ep(pool)
    add_job(pool, "carol", "ep1", "carol", 20)           # labelled, on the OVS EP
    for name, owner, n in (("mallory", "mallory", 35), ("bob", "bob", 36)):
        bridge_job(pool, lb, name, owner, n)
    code, body = pool.register("carol")
    assert code == 200 and body["label"]["vid"] not in (labels.COMMON_VID, labels.BLOCKED_VID), body
    program_edge(pool, "ep1", {"carol": (body["label"]["vid"], body["label"]["pcp"])})
    answers = {name: pool.register(name, tagged=False) for name in ("mallory", "bob")}
    assert all(code == 200 for code, _ in answers.values()), answers
    ip, ns = pool.ip, {name: j["ns"] for name, j in pool.jobs.items()}
    # the controls: an untagged job reaches the router and the WAN host reaches it; the labelled job the router
    assert pool.connects("bob", GW, 7000) and reaches_from_wan(pool, ip("bob")) and pool.connects("carol", GW, 7000)
    # a dropped owner's job reaches nothing and nothing reaches it
    assert not pool.connects("mallory", GW, 7000), "the dropped owner's untagged job passed the core"
    assert not reaches_from_wan(pool, ip("mallory")), "the WAN host reached the dropped owner's untagged job"
    # a sliced untagged job's frame reaches no labelled job of another slice (nor the other way)
    assert not frame_arrives(ns["bob"], ns["carol"], 0), "bob's untagged frame reached carol's labelled job"
    assert not frame_arrives(ns["carol"], ns["bob"], 0)
    # no label to tag with: the per-job flows on the core instead (2 for the dropped job)
    st = pool.api("GET", "/v1/status", cert="controller")[1]
    per_job = {j["key"]: j["flows"] for j in st["jobs"]}
    assert not any("label" in body for _, body in answers.values()), answers
    assert per_job["slot-carol"] == 0 and per_job["slot-mallory"] == 2 and per_job["slot-bob"] >= 5, per_job
    drops = [f for f in pool.flows() if f"priority={labels.P_SLICED_UNTAGGED}," in f]
    assert drops and any("n_packets=0" not in f for f in drops), drops
