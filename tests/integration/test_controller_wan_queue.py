"""WAN bandwidth per accounting group by queues (`[wan] mechanism = "queue"`, issue 12) and per WAN port rates, on a
real OVS (private, userspace datapath) with the real controller process: Lark's QoS/Queue rows made at a group's
first registration and removed at its last, the tc classification the userspace datapath needs, reconciliation
after a kill -9, two TCP jobs of a group shaped to the group's rate and sharing it evenly, and steered traffic
limited by the group's rate for the steered port (meters and queues)."""
import json
import re
import shutil
import threading
import time

import pytest

from helpers.sdn import BRIDGE, SdnPool, sh, started_pool
from helpers.waits import wait_for
from helpers.wan_traffic import tcp_upload, udp_upload, wan_rx_bytes
from lark.controller.wan import METER_BASE, PORT_STRIDE

pytestmark = pytest.mark.skipif(not shutil.which("ovs-vswitchd"), reason="Open vSwitch is not installed")

GROUPS = """
[[wan_group]]
name = "cms"
select = 'AcctGroup =?= "cms"'
rate_mbit = 20
[wan_group.port_rate]
wan1 = 8
[[wan_group]]
name = "other"
select = 'AcctGroup =?= "physics"'
rate_mbit = 8
"""
STEER_CMS = """
[[policy]]
name = "cms-wan1"
kind = "wan_steer"
select = 'AcctGroup =?= "cms"'
port = "wan1"
"""


def queue_config(tmp_path, extra: str = "") -> str:
    return GROUPS + extra + f'[wan]\nmechanism = "queue"\novsdb = "unix:{tmp_path}/ovs/db.sock"\n'


@pytest.fixture
def pool(tmp_path):
    yield from started_pool(str(tmp_path), queue_config(tmp_path), reconcile_grace=2.0)


def ovs_json(pool, *args: str) -> list[dict]:
    """Rows of `ovs-vsctl --format=json list|find ...` as dicts (the test may use ovs-vsctl; Lark does not)."""
    data = json.loads(pool.ovs.vsctl("--format=json", *args))
    out = []
    for row in data["data"]:
        d = {}
        for k, v in zip(data["headings"], row):
            d[k] = dict(v[1]) if isinstance(v, list) and v and v[0] == "map" else v
        out.append(d)
    return out


def lark_queues(pool) -> dict[tuple[str, str], int]:
    """(group, port) -> max-rate of Lark's Queue rows."""
    return {(q["external_ids"]["lark-group"], q["external_ids"]["lark-port"]): int(q["other_config"]["max-rate"])
            for q in ovs_json(pool, "list", "Queue") if q["external_ids"].get("lark-owner") == "controller"}


def port_qos(pool, port: str) -> str | None:
    """The uuid of the port's QoS row, None when it has none."""
    v = ovs_json(pool, "list", "Port", port)[0]["qos"]
    return v[1] if v[0] == "uuid" else None


def tc(pool, *args: str) -> str:
    return sh(["tc", "-n", pool.core, *args]).stdout


def job_classes(pool, port: str = "wan0") -> dict[str, str]:
    """The job classes (1:f001..) on a WAN port -> their parent (the group's class)."""
    return dict(re.findall(r"^class htb (1:f[0-9a-f]+) parent (1:[0-9a-f]+)", tc(pool, "class", "show", "dev", port),
                           re.M))


def filters(pool, port: str = "wan0") -> dict[str, str]:
    """Lark's u32 filters on a WAN port: source address (hex, as tc prints it) -> class."""
    out = {}
    for f in json.loads(tc(pool, "-json", "filter", "show", "dev", port)):
        o = f.get("options", {})
        if f.get("pref") == 0x4C00 and "flowid" in o:
            out[o["match"]["value"]] = o["flowid"]
    return out


def bounces(pool, port: str = "wan0") -> bool:
    """Lark's egress filter sends the port's packets through its ifb, and the ifb is there."""
    egress = json.loads(tc(pool, "-json", "filter", "show", "dev", port, "egress") or "[]")
    ifb = sh(["ip", "-n", pool.core, "link", "show", "dev", f"lq-{port}"], check=False).returncode == 0
    redirect = [f for f in egress if f.get("pref") == 0x4C02 and "lq-" + port in json.dumps(f)]
    assert bool(redirect) == ifb, f"filter {redirect} and ifb {ifb} disagree"
    return ifb


def hexip(n: int) -> str:
    return f"{(10 << 24) | (77 << 16) | (1 << 8) | n:x}"


def ok(answer: tuple[int, dict], pool) -> bool:
    """An API answer was 200; else fail with its body and the controller's log."""
    code, body = answer
    assert code == 200, f"{code} {body}\n{pool.log()}"
    return True


def test_queues_follow_the_groups_first_and_last_job(pool):
    pool.add_job("c1", "ep1", "alice", 10, group="cms")
    pool.add_job("c2", "ep2", "bob", 11, group="cms")
    pool.add_job("p1", "ep1", "carol", 12, group="physics")
    pool.add_job("u1", "ep1", "dave", 13, group="")
    # the site's own QoS and queue on a job port: Lark never touches them
    pool.ovs.vsctl("--", "set", "Port", "j13-" + pool.id, "qos=@q", "--", "--id=@q", "create", "QoS",
                   "type=linux-htb", "queues:5=@u", "--", "--id=@u", "create", "Queue", "other_config:max-rate=1000000")
    assert lark_queues(pool) == {} and port_qos(pool, "wan0") is None
    assert ok(pool.register("c1"), pool)
    assert lark_queues(pool) == {("cms", "wan0"): 20_000_000}
    qos = ovs_json(pool, "list", "QoS", port_qos(pool, "wan0"))[0]
    assert qos["type"] == "linux-htb" and qos["external_ids"] == {"lark-owner": "controller", "lark-port": "wan0"}
    assert "rate 20Mbit ceil 20Mbit burst 25000b" in tc(pool, "class", "show", "dev", "wan0", "classid", "1:2")
    # the userspace datapath ignores set_queue, so the job's source address is classified by tc, into its class
    assert job_classes(pool) == {"1:f001": "1:2"} and filters(pool) == {hexip(10): "1:f001"}
    # ...after a bounce through an ifb, so that packets waiting in these queues do not hold the switch's AF_PACKET
    # send buffer (test_a_slow_groups_backlog_does_not_starve_the_fast_group)
    assert bounces(pool) and not bounces(pool, "wan1")
    assert [f for f in pool.flows() if "set_queue:1" in f and "nw_src=10.77.1.10" in f], pool.flows()
    assert ok(pool.register("c2"), pool) and ok(pool.register("u1"), pool)
    assert set(lark_queues(pool)) == {("cms", "wan0")}, "an unmatched job (unmatched = pass) made a queue"
    assert ok(pool.register("p1"), pool)
    assert lark_queues(pool) == {("cms", "wan0"): 20_000_000, ("other", "wan0"): 8_000_000}
    assert sorted(job_classes(pool).values()) == ["1:2", "1:2", "1:3"]
    assert filters(pool)[hexip(12)] in job_classes(pool) and len(filters(pool)) == 3
    # the first cms job leaves: the group keeps its queue for c2; c1's class and filter go
    assert ok(pool.unregister("c1"), pool)
    assert set(lark_queues(pool)) == {("cms", "wan0"), ("other", "wan0")}
    assert hexip(10) not in filters(pool) and len(job_classes(pool)) == 2
    assert ok(pool.unregister("c2"), pool)
    assert set(lark_queues(pool)) == {("other", "wan0")}
    assert ok(pool.unregister("p1"), pool) and ok(pool.unregister("u1"), pool)
    assert lark_queues(pool) == {} and port_qos(pool, "wan0") is None, "Lark left queues behind"
    assert not bounces(pool), "Lark's ifb or its egress filter outlived its queues"
    assert "clsact" not in tc(pool, "qdisc", "show", "dev", "wan0")
    assert not [q for q in ovs_json(pool, "list", "QoS") if q["external_ids"].get("lark-owner")]
    site = ovs_json(pool, "list", "Queue")
    assert len(site) == 1 and site[0]["other_config"] == {"max-rate": "1000000"}, "the site's queue was touched"
    assert not [f for f in pool.flows() if "set_queue" in f]
    code, st = pool.api("GET", "/v1/status", cert="controller")
    assert [(g["group"], g["mechanism"], g["queue"], g["jobs"]) for g in st["wan_groups"]] == [
        ("cms", "queue", 1, 0), ("other", "queue", 2, 0)]


@pytest.fixture
def slow_pool(tmp_path):
    """Reconciliation waits 6 s after a start: long enough to look at the switch before it."""
    yield from started_pool(str(tmp_path), queue_config(tmp_path), reconcile_grace=6.0)


def test_queues_reconciled_after_kill_9(slow_pool):
    pool = slow_pool
    pool.add_job("c1", "ep1", "alice", 10, group="cms")
    pool.add_job("p1", "ep1", "carol", 12, group="physics")
    assert ok(pool.register("c1"), pool) and ok(pool.register("p1"), pool)
    assert set(lark_queues(pool)) == {("cms", "wan0"), ("other", "wan0")}
    pool.kill_controller()
    # while the controller is down: the physics job left (its queue, class and filter are now stale), and someone
    # changed cms' rate by hand
    cms = [q["_uuid"][1] for q in ovs_json(pool, "list", "Queue") if q["external_ids"]["lark-group"] == "cms"][0]
    pool.ovs.vsctl("set", "Queue", cms, "other_config:max-rate=5000000", "other_config:min-rate=5000000")
    pool.start_controller()
    pool.wait_switch()
    # before larkd's resync and the grace period nothing of the jobs' is removed: they keep their shaping
    assert set(lark_queues(pool)) == {("cms", "wan0"), ("other", "wan0")} and len(filters(pool)) == 2
    assert lark_queues(pool)[("cms", "wan0")] == 20_000_000, "the hand-changed rate was not put back"
    assert pool.sync("ep1", ["c1"])[0] == 200          # larkd's full resync after the controller restarted
    assert wait_for(lambda: set(lark_queues(pool)) == {("cms", "wan0")}), \
        f"queues {lark_queues(pool)}\n{pool.log()}"
    assert filters(pool) == {hexip(10): "1:f001"} and job_classes(pool) == {"1:f001": "1:2"}, \
        "c1's class was not adopted or p1's not removed"
    assert len([f for f in pool.flows() if "set_queue:1" in f]) == 1


def test_two_tcp_jobs_of_a_group_are_shaped_to_its_rate_and_share_it(tmp_path):
    """Two cms jobs upload TCP at once through the group's queue: together they get no more than the group's rate
    (a job left out of the group's class would go out unlimited), both move traffic through it, and the queue's
    counters see it. How exactly the rate and the share hold is bench/wan_groups.py's (a timed test on a shared
    machine would only measure the machine)."""
    rate = 40
    p = SdnPool(str(tmp_path), policies=queue_config(tmp_path).replace("rate_mbit = 20", f"rate_mbit = {rate}"))
    try:
        p.start()
        p.add_job("c1", "ep1", "alice", 10, group="cms")
        p.add_job("c2", "ep2", "bob", 11, group="cms")
        assert ok(p.register("c1"), p) and ok(p.register("c2"), p)
        a, b = tcp_upload(p, ["c1", "c2"], 8)
        expect = rate * 0.956
        print(f"queue, {rate} Mbit/s group: jobs {a:.1f} + {b:.1f} = {a + b:.1f} Mbit/s (expect {expect:.1f}), "
              f"ratio {min(a, b) / max(a, b):.2f}")
        assert a + b <= rate * 1.05, f"aggregate {a + b:.1f} Mbit/s through a {rate} Mbit/s group queue"
        assert a + b >= expect * 0.5, f"aggregate {a + b:.1f} Mbit/s: the queue passes far less than its rate"
        assert min(a, b) >= 0.1 * (a + b), f"the group's two jobs got {a:.1f} and {b:.1f} Mbit/s: one is starved"
        st = p.api("GET", "/v1/status", cert="controller")[1]["wan_groups"][0]
        assert wait_for(lambda: p.api("GET", "/v1/status", cert="controller")[1]["wan_groups"][0]["bytes"]
                        >= (a + b) * 1e6 / 8 * 8 * 0.9), st
    finally:
        p.close()


def _meters(pool) -> str:
    return sh(["ovs-ofctl", "-O", "OpenFlow13", "dump-meters", f"unix:{pool.ovs.dir}/{BRIDGE}.mgmt"]).stdout


def test_steered_traffic_is_metered_at_the_groups_rate_for_that_port(tmp_path):
    """cms is steered out wan1, where its rate is 8 Mbit/s (20 elsewhere): its meter for (cms, wan1) polices the
    steered traffic, which before per-port limits left in table 2 unmetered."""
    p = SdnPool(str(tmp_path), policies=GROUPS + STEER_CMS, reconcile_grace=2.0)
    try:
        p.start()
        p.add_job("c1", "ep1", "alice", 10, group="cms")
        p.add_job("c2", "ep2", "bob", 11, group="cms")
        assert ok(p.register("c1"), p) and ok(p.register("c2"), p)
        wan1_meter = METER_BASE + PORT_STRIDE
        assert f"meter={wan1_meter} kbps" in _meters(p) and "rate=8000" in _meters(p), _meters(p)
        assert f"meter={METER_BASE} " not in _meters(p), "the normal exit's meter was made for steered jobs"
        steered = [f for f in p.flows() if f"meter:{wan1_meter}" in f]
        assert len(steered) == 2 and all("table=2" in f and "output:" in f for f in steered), steered
        seconds = 4
        before0, before1 = wan_rx_bytes(p, "w0"), wan_rx_bytes(p, "w1")
        udp_upload(p, ["c1", "c2"], 15, seconds)
        got = (wan_rx_bytes(p, "w1") - before1) * 8 / seconds / 1e6
        leaked = (wan_rx_bytes(p, "w0") - before0) * 8 / seconds / 1e6
        print(f"steered cms (8 Mbit/s on wan1) offered 2 x 15: {got:.1f} Mbit/s on wan1, {leaked:.2f} on wan0")
        assert 4 <= got <= 11, f"steered cms traffic {got:.1f} Mbit/s through an 8 Mbit/s meter"
        assert leaked < 1, "steered traffic left by wan0"
        st = p.api("GET", "/v1/status", cert="controller")[1]["wan_groups"][0]
        assert [(r["port"], r["rate_mbit"], r["jobs"]) for r in st["ports"]] == [("wan0", 20, 0), ("wan1", 8, 2)]
        assert ok(p.unregister("c1"), p) and ok(p.unregister("c2"), p)
        assert f"meter={wan1_meter} " not in _meters(p)
    finally:
        p.close()


def test_steered_traffic_gets_the_groups_queue_on_that_port(tmp_path):
    p = SdnPool(str(tmp_path), policies=queue_config(tmp_path, STEER_CMS), reconcile_grace=2.0)
    try:
        p.start()
        p.add_job("c1", "ep1", "alice", 10, group="cms")
        p.add_job("p1", "ep1", "carol", 12, group="physics")
        assert ok(p.register("c1"), p) and ok(p.register("p1"), p)
        assert lark_queues(p) == {("cms", "wan1"): 8_000_000, ("other", "wan0"): 8_000_000}
        assert job_classes(p, "wan1") == {"1:f001": "1:2"} and filters(p, "wan1") == {hexip(10): "1:f001"}
        assert filters(p, "wan0") == {hexip(12): "1:f001"} and job_classes(p, "wan0") == {"1:f001": "1:3"}
        steered = [f for f in p.flows() if "set_queue:1" in f]
        assert len(steered) == 1 and "table=2" in steered[0] and "output:" in steered[0], steered
        seconds = 4
        before = wan_rx_bytes(p, "w1")
        udp_upload(p, ["c1"], 20, seconds)
        got = (wan_rx_bytes(p, "w1") - before) * 8 / seconds / 1e6
        print(f"steered cms (8 Mbit/s queue on wan1) offered 20: {got:.1f} Mbit/s on wan1")
        assert 5 <= got <= 10, f"steered cms traffic {got:.1f} Mbit/s through an 8 Mbit/s queue"
        assert ok(p.unregister("c1"), p)
        assert set(lark_queues(p)) == {("other", "wan0")} and port_qos(p, "wan1") is None
    finally:
        p.close()


def group_sent_bytes(pool, port: str = "wan0") -> dict[str, int]:
    """Bytes each group's class on a WAN port has sent so far (htb's own counter, the bytes its rate applies to),
    keyed by the group class's id. From the text output: this iproute2 prints no JSON for classes."""
    parents = set(job_classes(pool, port).values())
    sent = re.findall(r"^class htb (1:[0-9a-f]+) .*\n\s*Sent (\d+) bytes", tc(pool, "-s", "class", "show", "dev", port),
                      re.M)
    return {handle: int(n) for handle, n in sent if handle in parents}


def test_a_slow_groups_backlog_does_not_starve_the_fast_group(tmp_path):
    """The attack a group's own jobs can make on another group: many uploads fill their group's (slow) queue. On a
    userspace datapath every packet waiting there held the switch's one AF_PACKET send buffer, and the switch then
    dropped what it sent on every port: a 900 Mbit/s group's job fell to 12.7 Mbit/s behind 8 jobs of a 100 Mbit/s
    group. With the bounce through the ifb the fast group's job keeps its rate. The bound here is loose (half the
    rate's goodput); how close it comes is bench/paper_wan.py's.
    The slow group's limit is read from its class's own counter over one common window of the switch's clock (the
    iperf3 clients start at different times on a loaded machine, so the sum of their own averages could exceed the
    rate without the queue ever doing so: it failed once at 21.9 of 20 that way)."""
    fast, slow, seconds = 200, 20, 8.0
    p = SdnPool(str(tmp_path), policies=queue_config(tmp_path).replace("rate_mbit = 20\n", f"rate_mbit = {fast}\n")
                .replace("rate_mbit = 8\n", f"rate_mbit = {slow}\n"))
    try:
        p.start()
        p.add_job("c1", "ep1", "alice", 10, group="cms")
        others = [f"p{i}" for i in range(6)]
        for i, name in enumerate(others):
            p.add_job(name, "ep2" if i % 2 else "ep1", "carol", 20 + i, group="physics")
        for name in ["c1", *others]:
            assert ok(p.register(name), p)
        assert bounces(p)
        slow_class = next(parent for parent in set(job_classes(p).values())
                          if sum(1 for q in job_classes(p).values() if q == parent) == len(others))
        result: list[list[float]] = []
        uploads = threading.Thread(target=lambda: result.append(tcp_upload(p, ["c1", *others], seconds)))
        uploads.start()
        time.sleep(3.0)                       # past the server start (0.5 s) and TCP slow start
        t0, b0 = time.monotonic(), group_sent_bytes(p)[slow_class]
        time.sleep(seconds - 4.5)             # ends before the first client can have stopped
        t1, b1 = time.monotonic(), group_sent_bytes(p)[slow_class]
        uploads.join(seconds + 90)
        assert result, "the uploads did not finish"
        got = result[0]
        slow_mbit = (b1 - b0) * 8 / (t1 - t0) / 1e6
        print(f"queue, cms {fast} / physics {slow} Mbit/s: cms job {got[0]:.1f}, physics jobs {sum(got[1:]):.1f} "
              f"({' '.join(f'{x:.1f}' for x in got[1:])}); the physics class sent {slow_mbit:.1f} Mbit/s in frames "
              f"over {t1 - t0:.1f} s")
        assert got[0] >= 0.5 * fast * 0.956, f"the cms job got {got[0]:.1f} Mbit/s of its group's {fast}: starved"
        # Margin for a loaded 2-core machine: the window's ends are read by separate tc processes, and htb may
        # send up to its burst (a few ms at this rate) beyond the rate in any window.
        assert slow_mbit <= slow * 1.15, f"the physics class sent {slow_mbit:.1f} Mbit/s through its {slow}"
    finally:
        p.close()
