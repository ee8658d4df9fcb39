"""lark-controller on a real OVS switch (private, userspace datapath) with the real controller process: each
policy observed with real TCP from job namespaces, restarts, forged registrations, and zero residue by cookie."""
import shutil
import ssl
import time

import pytest

from helpers.sdn import DROP_MALLORY, SLICE_AND_WAN_POLICIES, WAN_SERVER, GW, SdnPool, started_pool

pytestmark = pytest.mark.skipif(not shutil.which("ovs-vswitchd"), reason="Open vSwitch is not installed")

POLICIES = DROP_MALLORY + SLICE_AND_WAN_POLICIES


@pytest.fixture
def pool(tmp_path):
    yield from started_pool(str(tmp_path), POLICIES, reconcile_grace=2.0)


def jobs(pool):
    pool.add_job("alice1", "ep1", "alice", 10)
    pool.add_job("alice2", "ep2", "alice", 11)
    pool.add_job("bob", "ep2", "bob", 12, group="cms")
    pool.add_job("mallory", "ep1", "mallory", 13)
    pool.add_job("carol", "ep1", "carol", 14, group="students")
    for name in pool.jobs:
        code, body = pool.register(name)
        assert code == 200, body
        assert body["switches"] == 1


def test_policies_hold_for_real_traffic(pool):
    jobs(pool)
    # (b) slices: same owner across EPs talks, different owners do not
    assert pool.connects("alice1", pool.ip("alice2"))
    assert pool.connects("alice2", pool.ip("alice1"))
    assert not pool.connects("alice1", pool.ip("bob"))
    assert not pool.connects("bob", pool.ip("alice2"))
    # every job still reaches the site's router (not a job: outside every slice)
    assert pool.connects("alice1", GW, 7000)
    # (a) a blocked owner reaches nothing, and nothing reaches it
    assert not pool.connects("mallory", GW, 7000)
    assert not pool.connects("mallory", WAN_SERVER, 7000)
    # (c) WAN: students are dropped toward the WAN but reach the site; cms leaves by wan1; others by wan0
    assert pool.connects("carol", GW, 7000)
    assert not pool.connects("carol", WAN_SERVER, 7000)
    w0, w1 = pool.wan_rx("w0"), pool.wan_rx("w1")
    assert pool.connects("bob", WAN_SERVER, 7000)
    assert pool.wan_rx("w1") - w1 >= 3, "cms traffic did not leave by wan1"
    w1 = pool.wan_rx("w1")
    assert pool.connects("alice1", WAN_SERVER, 7000)
    assert pool.wan_rx("w1") == w1, "alice's WAN traffic left by the alternate port"
    assert pool.wan_rx("w0") > w0
    # flows per job are few and constant: 5 for a sliced job, 2 for a blocked one
    code, st = pool.api("GET", "/v1/status", cert="controller")
    per_job = {j["owner"]: j["flows"] for j in st["jobs"]}
    assert per_job == {"alice": 5, "bob": 5, "mallory": 2, "carol": 5}
    assert st["totals"]["job_flows"] == 22 and len(st["switches"]) == 1
    on_switch = [f for f in pool.flows() if "cookie=0x4a" in f]
    assert len(on_switch) == 22


def test_a_spoofed_source_address_is_dropped(pool):
    jobs(pool)
    ns = pool.jobs["bob"]["ns"]
    from helpers.sdn import sh
    sh(["ip", "-n", ns, "addr", "add", "10.77.1.10/16", "dev", "eth0"])   # alice1's address, bob's MAC
    code = ("import socket,sys\ns=socket.socket(); s.settimeout(1.5); s.bind(('10.77.1.10',0))\n"
            "print(s.connect_ex(('10.77.1.11',9000)))")
    cp = sh(["ip", "netns", "exec", ns, "python3", "-c", code], check=False)
    assert cp.stdout.strip() != "0"


def test_unregister_removes_every_flow_of_the_job_by_cookie(pool):
    jobs(pool)
    cookies = {j["job_id"]: j["cookie"] for j in pool.api("GET", "/v1/status", cert="controller")[1]["jobs"]}
    assert len(pool.flows_with_cookie(cookies["12.0"])) == 5
    code, body = pool.unregister("bob")
    assert code == 200 and body["removed"]
    assert pool.flows_with_cookie(cookies["12.0"]) == []
    assert pool.unregister("bob") == (200, {"removed": False, "ms": pytest.approx(0, abs=1000)})
    for name in ("alice1", "alice2", "mallory", "carol"):
        assert pool.unregister(name)[0] == 200
    assert [f for f in pool.flows() if "cookie=0x4a" in f] == []


def test_forged_registrations_are_refused(pool):
    pool.add_job("alice1", "ep1", "alice", 10)
    reg = pool.jobs["alice1"]["reg"]
    with pytest.raises((ssl.SSLError, ConnectionError, OSError)):
        pool.api("POST", "/v1/jobs", reg, cert=None)                       # no client certificate
    with pytest.raises((ssl.SSLError, ConnectionError, OSError)):
        pool.api("POST", "/v1/jobs", reg, cert="ep1", ca_dir=pool.tmp / "other-ca")  # a cert from another CA
    assert pool.api("GET", "/v1/status", cert="controller")[1]["totals"]["jobs"] == 0
    # A genuine EP cannot remove another EP's job: it acts only for the name in its certificate.
    assert pool.register("alice1")[0] == 200
    assert pool.api("DELETE", f"/v1/jobs/{reg['key']}", cert="intruder")[1]["removed"] is False
    assert pool.api("PUT", "/v1/sync", {"jobs": []}, cert="intruder")[0] == 200
    assert pool.api("GET", "/v1/status", cert="controller")[1]["totals"]["jobs"] == 1
    # Malformed registrations get a clear error naming the job and the field.
    code, body = pool.api("POST", "/v1/jobs", {**reg, "mac": "not-a-mac"}, cert="ep1")
    assert code == 400 and "job 10.0" in body["error"] and "mac" in body["error"]


def test_flows_keep_working_while_the_controller_is_down_and_resync_reconciles(pool):
    jobs(pool)
    cookies = {j["owner"]: j["cookie"] for j in pool.api("GET", "/v1/status", cert="controller")[1]["jobs"]}
    pool.kill_controller()
    # proactive flows stay on the (fail-secure) switch: policy still holds with no controller at all
    assert pool.connects("alice1", pool.ip("alice2"))
    assert not pool.connects("alice1", pool.ip("bob"))
    assert not pool.connects("mallory", GW, 7000)
    pool.start_controller()
    pool.wait_switch()
    # ep1 resyncs its full list (alice1 and carol; mallory's job ended while the controller was down); ep2 too
    assert pool.sync("ep1", ["alice1", "carol"])[0] == 200
    assert pool.sync("ep2", ["alice2", "bob"])[0] == 200
    st = pool.api("GET", "/v1/status", cert="controller")[1]
    assert st["totals"]["jobs"] == 4
    # after the grace period the controller removes the gone job's flows by cookie, and only those
    deadline = time.time() + 20
    while pool.flows_with_cookie(cookies["mallory"]) and time.time() < deadline:
        time.sleep(0.3)
    assert pool.flows_with_cookie(cookies["mallory"]) == []
    assert len(pool.flows_with_cookie(cookies["alice"])) == 5
    assert pool.connects("mallory", GW, 7000), "the gone job's drop flows were not removed"
    assert pool.connects("alice1", pool.ip("alice2")) and not pool.connects("alice1", pool.ip("bob"))
    # a resync that drops a job removes its flows at once
    assert pool.sync("ep2", ["alice2"])[0] == 200
    assert pool.flows_with_cookie(cookies["bob"]) == []


def test_status_command_prints_jobs_and_totals(pool):
    jobs(pool)
    from helpers.sdn import PY, sh
    cp = sh(["ip", "netns", "exec", pool.core, PY, "-m", "lark.controller.cli", "status", "--config",
             str(pool.cfg_path)])
    assert "switches connected: 1" in cp.stdout and "jobs: 5" in cp.stdout, cp.stdout
    assert "drop:blocked" in cp.stdout and "wan:cms-wan1" in cp.stdout


def test_a_restart_with_fewer_policies_removes_their_flows(pool):
    jobs(pool)
    wan_drop = "priority=200,ip,metadata=0x100000000/0xff00000000 actions=drop"
    assert any(wan_drop in f for f in pool.flows())
    base_before = [f for f in pool.flows() if "cookie=0x4c41524b00000000" in f]
    pool.kill_controller()
    pool.policies = POLICIES.split('[[policy]]\nname = "students-no-wan"')[0]   # keep "blocked" and "slices"
    pool.reconcile_grace = 60.0   # no EP resyncs here: keep job cookies out of this test's window
    pool.write_config()
    pool.start_controller()
    pool.wait_switch()
    base_after = [f for f in pool.flows() if "cookie=0x4c41524b00000000" in f]
    assert not any("metadata=0x100000000/" in f or "metadata=0x300000000/" in f for f in base_after), base_after
    assert len(base_after) == 5 and len(base_before) == 15
    # the jobs' own flows were left alone (they are reconciled by cookie after the grace period)
    assert len([f for f in pool.flows() if "cookie=0x4a" in f]) == 22


def test_openflow_over_tls(tmp_path):
    """The switch connects over TLS with its own certificate from the controller's CA, as a hardware switch would."""
    p = SdnPool(str(tmp_path), policies=POLICIES, openflow_tls=True)
    try:
        p.start()
        p.add_job("alice1", "ep1", "alice", 10)
        p.add_job("bob", "ep2", "bob", 12)
        assert p.register("alice1")[0] == 200 and p.register("bob")[0] == 200
        assert not p.connects("alice1", p.ip("bob")) and p.connects("alice1", GW, 7000)
    finally:
        p.close()


def test_sigterm_stops_the_controller_and_the_flows_stay(pool):
    import signal
    jobs(pool)
    pool.ctl.send_signal(signal.SIGTERM)
    assert pool.ctl.wait(10) == 0
    assert "stopping on signal 15" in pool.log()
    assert len([f for f in pool.flows() if "cookie=0x4a" in f]) == 22
    assert pool.connects("alice1", pool.ip("alice2")) and not pool.connects("alice1", pool.ip("bob"))
