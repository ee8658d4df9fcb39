"""The label scheme's EP side (issue 26) through larkd's real setup path: a fake EP whose larkd runs OVS mode (private
OVS, userspace datapath) registers its jobs with a real lark-controller (`[labels] mode = "vlan"`, mutual TLS) whose
core switch is a second bridge of the same OVS, the EP's uplink a veth pair into it, the WAN router behind the core.
larkd's bridge tags each job's frames toward the uplink with the label the registration answered (lark/kernel/attach/
ovs.py label_flows, under the job's cookie): the core drops the blocked VLAN, so a dropped owner's job reaches nothing
while an allowed one reaches the WAN host; untagged, both would pass the core as host traffic. Teardown leaves no flow
with the job's cookie. Jobs of one EP reach each other only as their labels allow (lark/labelflows.py: the core's rule,
applied on the EP), and a frame a job tags itself reaches no other slice."""
import copy
import json
import re
import shutil
import subprocess

import pytest
from helpers.frames import RECV_PY, frame_arrives, job_addr
from helpers.sdn import DROP_MALLORY, GW, SERVER_PY, WAN_SERVER, SdnPool, sh
from helpers.waits import wait_for, wait_ready

from lark.controller import certs
from lark.kernel.attach.ovs import LABEL_BRIDGE_COOKIE, cookie_of

pytestmark = pytest.mark.skipif(not shutil.which("ovs-vswitchd"), reason="Open vSwitch is not installed")
POLICIES = DROP_MALLORY + """
[labels]
mode = "vlan"
[ep.ep1]
ports = ["pe1"]
addresses = ["10.77.1.16/28"]
"""
# per-user slices besides the owner drop: jobs of one EP in different labels
SLICED = POLICIES + """
[[policy]]
name = "slices"
kind = "slice"
select = 'true'
"""
AD = 'ClusterId = {n}\nProcId = 0\nOwner = "{owner}"'
OVS_EP = dict(default_network_type="ovs_bridge", ovs_bridge_name="lkovs0", ovs_uplink="upl1")
# larkd's Linux bridge on the same uplink: its jobs are not tagged ("tagged": false), the core has per-job flows
BRIDGE_EP = dict(default_network_type="bridge", bridge_name="lkbr0", bridge_uplink="upl1")


@pytest.fixture
def labelled_ep(fakehost_factory, tmp_path, request):
    tls = tmp_path / "tls"
    certs.make(str(tls), ["controller=127.0.0.1", "ep1"])
    policies, ep = getattr(request, "param", POLICIES), OVS_EP
    if isinstance(policies, tuple):
        policies, ep = policies
    pool = SdnPool(str(tmp_path), policies=policies)
    host = fakehost_factory(ovs=True, **ep, ovs_datapath="netdev", bridge_range="10.77.1.17-10.77.1.30",
                            bridge_prefix=16, bridge_gateway=GW, controller_url=f"https://127.0.0.1:{pool.api_port}",
                            controller_ca=str(tls / "ca.pem"), controller_cert=str(tls / "ep1.pem"),
                            controller_key=str(tls / "ep1.key"), controller_timeout=3.0, controller_resync=3600.0)
    # the core: a bridge of the EP's own OVS (one ovs-vswitchd per netns), run by the controller in the EP's netns
    pool.core, pool.own_core = host.host_ns, False
    pool.ovs = copy.copy(host.ovs)
    pool.ovs.start = lambda: pool.ovs
    pool.ovs.close = lambda: None
    sh(host.in_host(["ip", "link", "add", "upl1", "type", "veth", "peer", "name", "pe1"]))
    for dev in ("upl1", "pe1"):
        sh(host.in_host(["ip", "link", "set", dev, "up"]))
    try:
        pool.start()
        pool.ovs.vsctl("add-port", "core", "pe1")
        pool._make_wan()
        yield host, pool
    finally:
        pool.close()


def ep_flows(host, cookie: str) -> list[str]:
    return [f for f in host.ovs_flows() if f"cookie={cookie}," in f]


def test_larkd_tags_its_ovs_jobs_with_the_controllers_label(labelled_ep):
    host, pool = labelled_ep
    runs = {}
    for slot, owner, n in (("slot1", "mallory", 81), ("slot2", "alice", 80)):
        p = host.spawn_job(slot, ["listen", "9000", "60"], job_ad=AD.format(n=n, owner=owner))
        runs[owner] = (p, wait_ready(host, slot))
    st = pool.api("GET", "/v1/status", cert="controller")[1]
    reg = {j["owner"]: j for j in st["jobs"]}
    assert set(reg) == {"alice", "mallory"}, st
    for owner, (_, job) in runs.items():
        ns, key = job["netns"], job["key"]
        cookie = "0x" + cookie_of(key)[2:].lstrip("0")
        def reach(dst: str, ns: str = ns) -> bool:
            code = ("import socket,sys\ntry: socket.create_connection((sys.argv[1],7000),timeout=1.5); print('ok')\n"
                    "except OSError: print('no')")
            return sh(["ip", "netns", "exec", ns, "python3", "-c", code, dst]).stdout.strip() == "ok"
        if owner == "alice":
            assert reach(WAN_SERVER) and reach(GW), host.larkd_log()[-3000:]
        else:
            assert not reach(WAN_SERVER) and not reach(GW), "the blocked job got past the core untagged"
        def tagged(cookie: str = cookie) -> list[str]:   # flow statistics reach dump-flows within a revalidator round
            return [f for f in ep_flows(host, cookie) if "priority=101," in f and "n_packets=0," not in f]
        assert wait_for(tagged), ep_flows(host, cookie)   # its frames went through the label's flows
    assert "with VLAN 4094, PCP 0" in host.larkd_log()
    for p, job in runs.values():
        host.end_job(p, job["netns"])
        cookie = "0x" + cookie_of(job["key"])[2:].lstrip("0")
        assert wait_for(lambda c=cookie: ep_flows(host, c) == []), ep_flows(host, cookie)
    left = host.wait_clean()
    own = "0x" + LABEL_BRIDGE_COOKIE[2:].lstrip("0")
    left["ovs"] = [f for f in left.get("ovs", []) if f"cookie={own}," not in f]
    assert left == {k: [] for k in left}, left
    assert json.dumps(pool.api("GET", "/v1/status", cert="controller")[1]["totals"]["jobs"]) == "0"


def connects(ns: str, dst: str, port: int) -> bool:
    code = ("import socket,sys\n"
            "try: socket.create_connection((sys.argv[1],int(sys.argv[2])),timeout=1.5); print('ok')\n"
            "except OSError: print('no')")
    return sh(["ip", "netns", "exec", ns, "python3", "-c", code, dst, str(port)]).stdout.strip() == "ok"


@pytest.mark.parametrize("labelled_ep", [SLICED], indirect=True)
def test_jobs_of_one_ep_reach_each_other_only_as_their_labels_allow(labelled_ep):
    """Same-EP delivery obeys the labels as the core does between EPs: two jobs of one slice reach each other, two
    jobs of different slices do not, a dropped owner's job neither reaches a neighbour nor is reached; a job sending
    a frame pre-tagged with another slice's VLAN id reaches nobody of that slice."""
    host, pool = labelled_ep
    jobs = {}
    for slot, owner, n in (("slot1", "alice", 80), ("slot2", "alice", 81), ("slot3", "bob", 82),
                           ("slot4", "mallory", 83)):
        ad = AD.format(n=n, owner=owner) + "\nInboundConnectivity = true"
        p = host.spawn_job(slot, ["sleep", "120"], job_ad=ad)
        jobs[f"{owner}{n}"] = (p, wait_ready(host, slot))
    ns = {name: job["netns"] for name, (_, job) in jobs.items()}
    servers = [subprocess.Popen(["ip", "netns", "exec", n, "python3", "-c", SERVER_PY, "7100"],
                                stdout=subprocess.PIPE, text=True) for n in ns.values()]
    for srv in servers:
        assert srv.stdout is not None and srv.stdout.readline().strip() == "ready"
    ip = {name: job_addr(n)[1] for name, n in ns.items()}
    log = (host.tmp / "larkd.log").read_text()
    vid = {name: int(re.findall(rf"job {n}\.0: its frames leave .* with VLAN (\d+)", log)[-1])
           for name, n in (("alice80", 80), ("alice81", 81), ("bob82", 82), ("mallory83", 83))}
    assert vid["alice80"] == vid["alice81"] != vid["bob82"] and vid["mallory83"] == 4094, vid
    # one slice on one EP: both ways (the control: local delivery works)
    assert connects(ns["alice80"], ip["alice81"], 7100) and connects(ns["alice81"], ip["alice80"], 7100)
    # different slices on one EP: neither way
    assert not connects(ns["bob82"], ip["alice80"], 7100), "a job of another slice reached alice's job on its EP"
    assert not connects(ns["alice80"], ip["bob82"], 7100)
    # a dropped owner's job: neither way
    assert not connects(ns["mallory83"], ip["alice80"], 7100), "the dropped owner's job reached a job on its EP"
    assert not connects(ns["alice80"], ip["mallory83"], 7100)
    # a frame pre-tagged with alice's VLAN id, from bob's own MAC and address: reaches no job of alice's slice;
    # the same frame untagged from alice's other job does (the control: the frame is deliverable)
    assert frame_arrives(ns["alice81"], ns["alice80"], 0)
    assert not frame_arrives(ns["bob82"], ns["alice80"], vid["alice80"]), "a pre-tagged frame crossed into a slice"
    assert not frame_arrives(ns["mallory83"], ns["alice80"], vid["alice80"])
    for p, job in jobs.values():
        host.end_job(p, job["netns"])
    for srv in servers:
        srv.wait(timeout=30)
    left = host.wait_clean()
    own = "0x" + LABEL_BRIDGE_COOKIE[2:].lstrip("0")
    left["ovs"] = [f for f in left.get("ovs", []) if f"cookie={own}," not in f]
    assert left == {k: [] for k in left}, left
    assert pool.api("GET", "/v1/status", cert="controller")[1]["totals"]["jobs"] == 0


BROADCAST_PY = """import socket,sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.setsockopt(socket.SOL_SOCKET, socket.SO_BROADCAST, 1)
for _ in range(3):
    s.sendto(b"site-broadcast", (sys.argv[1], int(sys.argv[2])))
"""


def test_untagged_broadcast_from_the_uplink_reaches_no_blocked_job(labelled_ep):
    """The WAN router (the untagged domain, behind the core) sends a subnet broadcast: NORMAL on the EP's bridge
    floods it from the uplink to every port that floods. The allowed job gets it (the control); the dropped owner's
    job does not (its port is no-flood, lark/labelflows.py port_mods). Before that it got it."""
    host, pool = labelled_ep
    jobs, got = {}, {}
    for slot, owner, n in (("slot1", "mallory", 81), ("slot2", "alice", 80)):
        ad = AD.format(n=n, owner=owner) + "\nInboundConnectivity = true"
        p = host.spawn_job(slot, ["sleep", "120"], job_ad=ad)
        jobs[owner] = (p, wait_ready(host, slot))
    rx = {owner: subprocess.Popen(["ip", "netns", "exec", job["netns"], "python3", "-c", RECV_PY, "7300"],
                                  stdout=subprocess.PIPE, text=True) for owner, (_, job) in jobs.items()}
    try:
        for r in rx.values():
            assert r.stdout is not None and r.stdout.readline().strip() == "ready"
        sh(["ip", "netns", "exec", pool.wan, "python3", "-c", BROADCAST_PY, "10.77.255.255", "7300"])
        for owner, r in rx.items():
            assert r.stdout is not None
            got[owner] = r.stdout.readline().strip()
    finally:
        for r in rx.values():
            r.kill()
            r.wait()
            if r.stdout is not None:
                r.stdout.close()
    assert got["alice"] == "site-broadcast", got
    assert got["mallory"] == "nothing", "the site's broadcast reached the dropped owner's job"
    # `lark status --verify` checks the label flows and the no-flood port; then both are undone by hand
    cp = host.lark("status", "--verify", "--json", check=False)
    st = json.loads(cp.stdout)
    assert cp.returncode == 0 and st["drift"] == [], st
    alice, mallory = jobs["alice"][1], jobs["mallory"][1]
    br = f"unix:{host.ovs.dir}/lkovs0.mgmt"
    sh(["ovs-ofctl", "del-flows", br, f"cookie={cookie_of(alice['key'])}/-1,table=1"])
    sh(["ovs-ofctl", "mod-port", br, mallory["host_if"], "flood"])
    cp = host.lark("status", "--verify", "--json", check=False)
    rows = {r["object"].split(" (")[0]: r for r in json.loads(cp.stdout)["drift"]}
    assert cp.returncode == 1 and set(rows) == {f"label flows of {alice['host_if']}",
                                                f"OVS port {mallory['host_if']} no-flood"}, rows
    for p, job in jobs.values():
        host.end_job(p, job["netns"])
    host.wait_clean()


@pytest.mark.parametrize("labelled_ep", [(POLICIES, BRIDGE_EP)], indirect=True)
def test_a_linux_bridge_job_gets_per_job_flows_at_a_label_scheme_core(labelled_ep):
    """larkd in Linux-bridge mode cannot tag its jobs: it registers them with "tagged": false and the controller
    answers no label and puts the per-job flows on the core. The dropped owner's job reaches neither the router nor
    the WAN host, the allowed one both (before, the controller labelled both, nobody applied the label, and the
    dropped owner's frames passed the core untagged)."""
    host, pool = labelled_ep
    runs = {}
    for slot, owner, n in (("slot1", "mallory", 81), ("slot2", "alice", 80)):
        p = host.spawn_job(slot, ["sleep", "60"], job_ad=AD.format(n=n, owner=owner))
        runs[owner] = (p, wait_ready(host, slot))
    ns = {owner: job["netns"] for owner, (_, job) in runs.items()}
    assert connects(ns["alice"], WAN_SERVER, 7000) and connects(ns["alice"], GW, 7000), host.larkd_log()[-3000:]
    assert not connects(ns["mallory"], GW, 7000), "the dropped owner's Linux-bridge job passed the core"
    assert not connects(ns["mallory"], WAN_SERVER, 7000)
    st = pool.api("GET", "/v1/status", cert="controller")[1]
    per_job = {j["owner"]: j["flows"] for j in st["jobs"]}
    assert per_job == {"mallory": 2, "alice": 4}, st   # unsliced alice: IPv4, spoof drop, by MAC, other ports
    assert "which only OVS mode applies" not in host.larkd_log()
    for p, job in runs.values():
        host.end_job(p, job["netns"])
    # (the fake host's residue check reads larkd's OVS bridge, which this EP has not: the controller's count instead)
    assert wait_for(lambda: pool.api("GET", "/v1/status", cert="controller")[1]["totals"]["jobs"] == 0)
