"""Policy between jobs on the SAME execution point, on a real OVS switch with the real controller: an "EP" is a
Linux bridge whose job ports larkd's code isolates (bridge_isolate_jobs), behind one switch port named in the
controller's ep_ports. Frames between its jobs go up to the switch, through the drop/slice tables, and come back
out the same port (output:IN_PORT) only when the policies allow."""
import shutil

import pytest

from helpers.sdn import GW, started_pool
from test_controller import POLICIES   # the drop (Owner "mallory"), slice and WAN policies

pytestmark = pytest.mark.skipif(not shutil.which("ovs-vswitchd"), reason="Open vSwitch is not installed")


@pytest.fixture
def pool(tmp_path):
    yield from started_pool(str(tmp_path), POLICIES, isolated_eps=("ep1",))


def jobs(pool):
    for name, owner, n in (("alice1", "alice", 20), ("alice2", "alice", 21), ("bob", "bob", 22),
                           ("mallory", "mallory", 23)):
        pool.add_job(name, "ep1", owner, n, behind=True)
    pool.add_job("alice3", "ep2", "alice", 24)          # on a port of its own: another EP
    for name in pool.jobs:
        code, body = pool.register(name)
        assert code == 200 and body["switches"] == 1, body


def test_policies_hold_between_jobs_behind_one_isolated_ep_port(pool):
    jobs(pool)
    ip = pool.ip
    # (b) same owner, same EP: through the core switch and back out the EP's port
    assert pool.connects("alice1", ip("alice2")) and pool.connects("alice2", ip("alice1"))
    # different owners on the same EP cannot, either way
    assert not pool.connects("alice1", ip("bob")) and not pool.connects("bob", ip("alice2"))
    # (a) the dropped owner reaches nobody on its EP, and nobody there reaches it
    assert not pool.connects("mallory", ip("alice1")) and not pool.connects("alice1", ip("mallory"))
    assert not pool.connects("mallory", ip("bob"))
    # the rest of the site as before: same owner on another EP, the router
    assert pool.connects("alice1", ip("alice3")) and pool.connects("alice3", ip("alice2"))
    assert pool.connects("bob", GW, 7000) and not pool.connects("mallory", GW, 7000)
    # flows: one more per job on the isolated EP (the hairpin), none for a blocked one; one base flow per EP port
    st = pool.api("GET", "/v1/status", cert="controller")[1]
    per_job = {j["key"]: j["flows"] for j in st["jobs"]}
    assert per_job == {"slot-alice1": 6, "slot-alice2": 6, "slot-bob": 6, "slot-mallory": 2, "slot-alice3": 5}
    port = pool.ovs.vsctl("get", "Interface", pool.ep_ports["ep1"], "ofport").strip()
    flows = pool.flows()
    hairpins = [f for f in flows if f"in_port={port}" in f and "actions=IN_PORT" in f and "cookie=0x4a" in f]
    assert len(hairpins) == 3, hairpins
    # the multicast flow survived the controller's reconciliation of its own flows on connect
    assert [f for f in flows if f"in_port={port}" in f and "dl_dst=01:00:00:00:00:00/01:00:00:00:00:00" in f
            and "actions=IN_PORT,NORMAL" in f], flows


def test_without_its_hairpin_flow_a_job_is_unreachable_from_its_own_ep(pool):
    """The control: isolation alone (no flows for the job) leaves the same-EP pair apart; the hairpin carries it."""
    jobs(pool)
    assert pool.connects("alice1", pool.ip("alice2"))
    assert pool.unregister("alice2")[0] == 200
    assert not pool.connects("alice1", pool.ip("alice2"))
    assert pool.connects("alice3", pool.ip("alice2"))   # from another EP: plain switching, as for any host
    assert pool.register("alice2")[0] == 200
    assert pool.connects("alice1", pool.ip("alice2"))
