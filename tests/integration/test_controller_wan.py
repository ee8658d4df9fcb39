"""WAN bandwidth per accounting group (issue 12) on a real OVS (private, userspace datapath) with the real
controller process: OpenFlow 1.3 meters made at a group's first registration, removed at its last, reconciled
after a kill -9, and a group's aggregate WAN traffic policed to its rate."""
import re
import shutil
import threading
import time

import pytest

from helpers.sdn import BRIDGE, GW, WAN_SERVER, SdnPool, sh, started_pool
from helpers.waits import wait_for
from helpers.wan_traffic import udp_upload, wan_rx_bytes
from lark.controller.wan import METER_BASE

pytestmark = pytest.mark.skipif(not shutil.which("ovs-vswitchd"), reason="Open vSwitch is not installed")

CMS, OTHER = METER_BASE, METER_BASE + 1
GROUPS = """
[[wan_group]]
name = "cms"
select = 'AcctGroup =?= "cms"'
rate_mbit = 20
[[wan_group]]
name = "other"
select = 'AcctGroup =?= "physics"'
rate_mbit = 8
"""


@pytest.fixture
def pool(tmp_path):
    yield from started_pool(str(tmp_path), GROUPS, reconcile_grace=2.0)


def meters(pool) -> dict[int, str]:
    """Meter id -> its description, read from the switch (the test may use ovs-ofctl; Lark does not)."""
    cp = sh(["ovs-ofctl", "-O", "OpenFlow13", "dump-meters", f"unix:{pool.ovs.dir}/{BRIDGE}.mgmt"])
    # each meter is a "meter=N ..." line followed by its band lines
    return {int(m.group(1)): m.group(0) for m in re.finditer(r"meter=(\d+)[^\n]*(?:\n(?!meter=|OFPST)[^\n]*)*",
                                                               cp.stdout)}


def add_meter(pool, mid: int, kbps: int) -> None:
    sh(["ovs-ofctl", "-O", "OpenFlow13", "add-meter", f"unix:{pool.ovs.dir}/{BRIDGE}.mgmt",
        f"meter={mid},kbps,band=type=drop,rate={kbps}"])


def test_meters_follow_the_groups_first_and_last_job(pool):
    pool.add_job("c1", "ep1", "alice", 10, group="cms")
    pool.add_job("c2", "ep2", "bob", 11, group="cms")
    pool.add_job("p1", "ep1", "carol", 12, group="physics")
    pool.add_job("u1", "ep1", "dave", 13, group="")
    add_meter(pool, 7, 1000)          # the site's own meter, outside Lark's range: never touched
    assert set(meters(pool)) == {7}
    assert pool.register("c1")[0] == 200
    m = meters(pool)
    assert set(m) == {7, CMS}
    assert "rate=20000" in m[CMS] and "burst_size=5000" in m[CMS], m[CMS]   # burst = 25% of the rate
    assert pool.register("c2")[0] == 200 and pool.register("u1")[0] == 200
    assert set(meters(pool)) == {7, CMS}, "an unmatched job (unmatched = pass) made a meter"
    assert pool.register("p1")[0] == 200
    assert set(meters(pool)) == {7, CMS, OTHER}
    # one metering flow per job address, under the job's cookie
    metered = [f for f in pool.flows() if f"meter:{CMS}" in f]
    assert len(metered) == 2 and all("nw_src=10.77.1.1" in f for f in metered), metered
    # the first cms job leaves: the group still has c2
    assert pool.unregister("c1")[0] == 200
    assert set(meters(pool)) == {7, CMS, OTHER}
    assert pool.unregister("c2")[0] == 200
    assert set(meters(pool)) == {7, OTHER}
    assert pool.unregister("p1")[0] == 200 and pool.unregister("u1")[0] == 200
    assert set(meters(pool)) == {7}, "Lark left meters behind"
    assert not [f for f in pool.flows() if "meter:" in f]
    code, st = pool.api("GET", "/v1/status", cert="controller")
    assert [(g["group"], g["jobs"]) for g in st["wan_groups"]] == [("cms", 0), ("other", 0)]


def test_meters_reconciled_after_kill_9(pool):
    pool.add_job("c1", "ep1", "alice", 10, group="cms")
    pool.add_job("p1", "ep1", "carol", 12, group="physics")
    assert pool.register("c1")[0] == 200 and pool.register("p1")[0] == 200
    assert set(meters(pool)) == {CMS, OTHER}
    pool.kill_controller()
    # while the controller is down: the physics job left (its meter is now stale) and someone deleted cms' meter
    # (OVS deletes the flows that name a deleted meter, as a crash-and-cleanup would)
    sh(["ovs-ofctl", "-O", "OpenFlow13", "del-meter", f"unix:{pool.ovs.dir}/{BRIDGE}.mgmt", f"meter={CMS}"])
    assert set(meters(pool)) == {OTHER}
    pool.start_controller()
    pool.wait_switch()
    assert pool.sync("ep1", ["c1"])[0] == 200          # larkd's full resync after the controller restarted
    assert wait_for(lambda: set(meters(pool)) == {CMS}), f"meters {sorted(meters(pool))}\n{pool.log()}"
    assert len([f for f in pool.flows() if f"meter:{CMS}" in f]) == 1


def meter_bytes(pool, mid: int) -> tuple[int, int]:
    """(bytes offered to a meter, bytes its drop band dropped) so far, from the switch's meter statistics."""
    cp = sh(["ovs-ofctl", "-O", "OpenFlow13", "meter-stats", f"unix:{pool.ovs.dir}/{BRIDGE}.mgmt", f"meter={mid}"])
    m = re.search(r"meter:(\d+) .*?byte_in_count:(\d+).*?bands:\s*0: packet_count:\d+ byte_count:(\d+)", cp.stdout,
                  re.S)
    assert m and int(m.group(1)) == mid, f"no statistics for meter {mid} in:\n{cp.stdout}"
    return int(m.group(2)), int(m.group(3))


def test_group_aggregate_is_policed_to_its_rate(pool):
    """Two cms jobs each offer 30 Mbit/s of UDP to the WAN; the cms meter (20 Mbit/s) lets ~20 through in all.

    The bound is read over one common window while the senders run, from the WAN link's receive counter, with the
    meter's own statistics over the same window as the control: it was offered more than its rate and dropped the
    excess, so the limit is the meter's doing, not the senders' or the switch's. (Before, the WAN bytes of the
    whole upload, staggered sender starts included, were divided by one sender's duration; and the control needed
    an unmetered run to reach 35 Mbit/s, which a loaded 2-core machine can miss.) How close the group comes to its
    rate is bench/wan_groups.py's and bench/paper_wan.py's."""
    pool.add_job("c1", "ep1", "alice", 10, group="cms")
    pool.add_job("c2", "ep2", "bob", 11, group="cms")
    assert pool.register("c1")[0] == 200 and pool.register("c2")[0] == 200
    rate_mbit, burst_kbit, seconds = 20, 5000, 8.0
    total_before = wan_rx_bytes(pool)
    uploads = threading.Thread(target=udp_upload, args=(pool, ["c1", "c2"], 30, seconds))
    uploads.start()
    time.sleep(2.5)                           # past the senders' interpreter start, even a slow one
    t0, rx0, (in0, drop0) = time.monotonic(), wan_rx_bytes(pool), meter_bytes(pool, CMS)
    time.sleep(seconds - 4.0)                 # ends before the first sender can have stopped
    t1, rx1, (in1, drop1) = time.monotonic(), wan_rx_bytes(pool), meter_bytes(pool, CMS)
    uploads.join(seconds + 60)
    assert not uploads.is_alive(), "the UDP senders did not finish"
    window = t1 - t0
    passed_mbit, offered_mbit = (rx1 - rx0) * 8 / window / 1e6, (in1 - in0) * 8 / window / 1e6
    print(f"cms (20 Mbit/s meter) over {window:.1f} s: offered {offered_mbit:.1f}, reached the WAN "
          f"{passed_mbit:.1f} Mbit/s, the meter dropped {(drop1 - drop0) * 8 / window / 1e6:.1f}")
    assert offered_mbit > rate_mbit and drop1 > drop0, \
        f"the meter was offered {offered_mbit:.1f} Mbit/s and dropped {drop1 - drop0} bytes: the test cannot tell"
    # A token bucket passes at most rate x window + its burst in any window; 15 % on top for the window's ends being
    # read by separate processes on a loaded machine.
    ceiling_bits = (rate_mbit * 1e6 * window + burst_kbit * 1e3) * 1.15
    assert (rx1 - rx0) * 8 <= ceiling_bits, \
        f"cms aggregate {passed_mbit:.1f} Mbit/s over {window:.1f} s through a {rate_mbit} Mbit/s meter"
    # The meter limits, it does not block: at least half of its rate got through (accuracy is the benches').
    assert passed_mbit >= 0.5 * rate_mbit, f"only {passed_mbit:.1f} Mbit/s of the cms group reached the WAN"
    total = wan_rx_bytes(pool) - total_before
    assert wait_for(lambda: pool.api("GET", "/v1/status", cert="controller")[1]["wan_groups"][0]["bytes"]
                    >= total * 0.9), pool.api("GET", "/v1/status", cert="controller")[1]["wan_groups"]


def test_unmatched_drop_keeps_ungrouped_jobs_off_the_wan_but_on_the_site(tmp_path):
    p = SdnPool(str(tmp_path), policies=GROUPS + '[wan]\nunmatched = "drop"\n', reconcile_grace=2.0)
    try:
        p.start()
        p.add_job("c1", "ep1", "alice", 10, group="cms")
        p.add_job("u1", "ep1", "dave", 13)
        assert p.register("c1")[0] == 200 and p.register("u1")[0] == 200
        assert p.connects("c1", WAN_SERVER, 7000)
        assert not p.connects("u1", WAN_SERVER, 7000)
        assert p.connects("u1", GW, 7000), "the site stays reachable for a job without a WAN group"
        assert p.connects("u1", p.ip("c1"))
    finally:
        p.close()
