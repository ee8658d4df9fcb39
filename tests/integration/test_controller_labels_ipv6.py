"""The label scheme's IPv6 path (issue 26) on a real OVS (userspace datapath, private OVS_RUNDIR) with the real
controller: jobs with an IPv4 and a global IPv6 address in their EP's [ep.NAME] ranges, on two EP bridges running
lark.controller.labels.edge_flows. IPv6 is tagged and matched as IPv4 is: the EP tags the job's frames from its own
IPv6 address (own_up), the core admits a tagged frame from the EP's port with a source in the EP's IPv6 network and
keeps the tag toward a job's IPv6 address, so one slice's jobs reach each other over IPv6 across EPs, another slice's
job and a dropped owner's do not. Neighbour discovery between jobs runs from their global addresses (Linux solicits
from the address of the packet that needs the neighbour): the solicitation goes to a multicast address, so the core
pops it into the untagged domain; the advertisement is unicast to a job address and keeps its tag."""
import shutil
import subprocess

import pytest
from helpers.sdn import DROP_MALLORY_AND_SLICES, PY, sh, started_pool
from test_controller_labels import add_job, make_edges, program_edge

pytestmark = pytest.mark.skipif(not shutil.which("ovs-vswitchd"), reason="Open vSwitch is not installed")

POLICIES = DROP_MALLORY_AND_SLICES + """
[labels]
mode = "vlan"
[ep.ep1]
ports = ["pe1"]
addresses = ["10.77.1.16/28", "fd77::1:0/112"]
[ep.ep2]
ports = ["pe2"]
addresses = ["10.77.1.32/28", "fd77::2:0/112"]
"""
SERVER6_PY = ("import socket,sys\n"
              "s=socket.socket(socket.AF_INET6); s.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1)\n"
              "s.bind(('::',int(sys.argv[1]))); s.listen(64); print('ready',flush=True)\n"
              "while True:\n c,_=s.accept(); c.sendall(b'hi'); c.close()\n")
CONNECT_PY = ("import socket,sys\ntry:\n s=socket.create_connection((sys.argv[1],9600),timeout=2); "
              "print(s.recv(2).decode())\nexcept OSError as e: print('fail',e)")


@pytest.fixture
def pool(tmp_path):
    yield from started_pool(str(tmp_path), POLICIES)


def v6(n: int) -> str:
    return f"fd77::{1 if n < 32 else 2}:{n}"


def add_job6(pool, name: str, ep: str, owner: str, n: int) -> None:
    """add_job's job with a global IPv6 address too (no DAD), on-link /64, listening on 9600 over IPv6."""
    add_job(pool, name, ep, owner, n)
    ns = pool.jobs[name]["ns"]
    sh(["ip", "-n", ns, "addr", "add", f"{v6(n)}/64", "dev", "eth0", "nodad"])
    pool.jobs[name]["reg"]["addresses"].append(v6(n))
    p = subprocess.Popen(["ip", "netns", "exec", ns, PY, "-c", SERVER6_PY, "9600"], stdout=subprocess.PIPE, text=True)
    pool.procs.append(p)
    assert p.stdout is not None and p.stdout.readline().strip() == "ready"


def connects6(pool, src: str, dst: str) -> bool:
    cp = sh(["ip", "netns", "exec", pool.jobs[src]["ns"], PY, "-c", CONNECT_PY, v6(dst)])
    return cp.stdout.strip() == "hi"


def test_ipv6_is_labelled_and_matched_as_ipv4_is(pool):
    make_edges(pool)
    jobs = (("alice1", "ep1", "alice", 20), ("mallory", "ep1", "mallory", 21), ("alice2", "ep2", "alice", 33),
            ("bob", "ep2", "bob", 34))
    for name, ep, owner, n in jobs:
        add_job6(pool, name, ep, owner, n)
    got = {}
    for name in pool.jobs:
        code, body = pool.register(name)
        assert code == 200, body
        got[name] = (body["label"]["vid"], body["label"]["pcp"])
    for ep in ("ep1", "ep2"):
        program_edge(pool, ep, got)
    n = {name: num for name, _, _, num in jobs}
    # one slice across EPs over IPv6, both ways (the control: the core admits and delivers tagged IPv6)
    assert connects6(pool, "alice1", n["alice2"]) and connects6(pool, "alice2", n["alice1"])
    # another slice, and a dropped owner's job: neither way
    assert not connects6(pool, "bob", n["alice1"]) and not connects6(pool, "alice1", n["bob"])
    assert not connects6(pool, "mallory", n["alice2"]) and not connects6(pool, "alice2", n["mallory"])
    # it went tagged: the core's IPv6 source flow for each EP counted packets
    src6 = [f for f in pool.flows() if "ipv6_src=fd77::" in f and "vlan_tci=0x1000/0x1000" in f]
    assert len(src6) == 2 and all("n_packets=0," not in f for f in src6), src6
