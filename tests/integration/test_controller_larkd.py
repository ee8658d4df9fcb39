"""A real larkd on a fake execution point registers a real bridged job with the real controller (mutual TLS) before
the job runs, removes it at teardown, and refuses (closed) or starts (open) jobs while the controller is down."""
import json
import shutil
import time

import pytest

from helpers.fakehost import WORLD_IP
from lark.controller import certs
from helpers.sdn import SdnPool
from helpers.waits import wait_for, wait_ready

pytestmark = pytest.mark.skipif(not shutil.which("ovs-vswitchd"), reason="Open vSwitch is not installed")
BRIDGE_CFG = dict(default_network_type="bridge", bridge_name="lkbr0", bridge_uplink="up0",
                  bridge_range="198.51.100.100-198.51.100.149", bridge_prefix=24, bridge_gateway=WORLD_IP)
AD = 'ClusterId = {n}\nProcId = 0\nOwner = "alice"\nAcctGroup = "cms"\nProjectName = "lhc"'


def ep_host(fakehost_factory, tmp_path, **kw):
    """A fake EP whose larkd talks to a controller (not started yet) in the EP's own netns, on loopback. It resyncs
    only when it starts (controller_resync is long), so the tests see which event restored the controller's view."""
    tls = tmp_path / "tls"
    certs.make(str(tls), ["controller=127.0.0.1", "ep1"])
    pool_ports = SdnPool(str(tmp_path))   # only for its free ports and TLS paths; started later in the EP netns
    host = fakehost_factory(**BRIDGE_CFG, controller_url=f"https://127.0.0.1:{pool_ports.api_port}",
                            controller_ca=str(tls / "ca.pem"), controller_cert=str(tls / "ep1.pem"),
                            controller_key=str(tls / "ep1.key"), controller_timeout=2.0,
                            controller_attributes=["ProjectName"], controller_resync=3600.0, **kw)
    return host, pool_ports


def start_controller(host, pool_ports) -> SdnPool:
    pool = SdnPool(str(pool_ports.tmp), core_ns=host.host_ns, policies="""
[[policy]]
name = "lhc-slice"
kind = "slice"
select = 'ProjectName =?= "lhc"'
""")
    pool.of_port, pool.api_port = pool_ports.of_port, pool_ports.api_port
    return pool.start()


@pytest.fixture
def closed_ep(fakehost_factory, tmp_path):
    host, ports = ep_host(fakehost_factory, tmp_path)
    yield host, ports
    ports.close()


def test_larkd_registers_a_real_job_before_it_runs_and_removes_it_at_teardown(closed_ep):
    host, ports = closed_ep
    # Controller down, controller_failure = closed: the job is refused with a clear error and leaves nothing.
    cp = host.run_job("slot1", ["env"], job_ad=AD.format(n=70))
    assert cp.returncode != 0
    assert "job 70.0" in cp.stderr and "SDN controller did not acknowledge" in cp.stderr, cp.stderr
    assert host.wait_clean() == {k: [] for k in host.residue()}

    pool = start_controller(host, ports)
    try:
        p = host.spawn_job("slot2", ["listen", "9000", "30"], job_ad=AD.format(n=71))
        j = wait_ready(host, "slot2")
        ip = j["plan"]["ipv4"]
        # As soon as larkd reports the job ready (it answered the wrapper), its flows are on the switch.
        st = pool.api("GET", "/v1/status", cert="controller")[1]
        [reg] = st["jobs"]
        assert (reg["job_id"], reg["ep"], reg["owner"], reg["addresses"]) == ("71.0", "ep1", "alice", [ip])
        assert reg["attrs"] == {"ProjectName": "lhc"} and reg["slice"] == "lhc-slice:alice"
        flows = pool.flows_with_cookie(reg["cookie"])
        assert len(flows) == 5 and any(f"nw_src={ip}" in f for f in flows), flows
        assert f"registered with the controller: cookie {reg['cookie']}" in host.larkd_log()
        p.kill()
        p.wait(10)  # the starter; its job ends on its own listen timeout
        assert host.wait_clean() == {k: [] for k in host.residue()}
        assert wait_for(lambda: pool.flows_with_cookie(reg["cookie"]) == []), pool.flows_with_cookie(reg["cookie"])
        assert pool.api("GET", "/v1/status", cert="controller")[1]["totals"]["jobs"] == 0
    finally:
        pool.close()


def test_fail_open_starts_the_job_and_warns(fakehost_factory, tmp_path):
    host, ports = ep_host(fakehost_factory, tmp_path, controller_failure="open")
    cp = host.run_job("slot1", ["env"], job_ad=AD.format(n=72))
    assert cp.returncode == 0, cp.stderr + host.larkd_log()
    assert json.loads(cp.stdout)["LARK_IPV4_ADDRESS"].startswith("198.51.100.1")
    assert "job 72.0 starts without the pool controller's flows (controller_failure = open)" in host.larkd_log()


def test_restarted_larkd_resyncs_its_jobs_to_the_controller(closed_ep):
    host, ports = closed_ep
    pool = start_controller(host, ports)
    try:
        p = host.spawn_job("slot3", ["listen", "9000", "45"], job_ad=AD.format(n=73))  # outlives slow restarts
        wait_ready(host, "slot3")
        # The controller loses its state (kill -9 and start) while larkd is down (a running larkd would resync it at
        # once: tests/integration/test_controller_ha.py), then larkd starts: its first resync restores it.
        host.stop_larkd()
        pool.kill_controller()
        pool.start_controller()
        pool.wait_switch()
        assert pool.api("GET", "/v1/status", cert="controller")[1]["totals"]["jobs"] == 0
        host.start_larkd()
        deadline = time.time() + 30
        while time.time() < deadline:
            st = pool.api("GET", "/v1/status", cert="controller")[1]
            if st["totals"]["jobs"] == 1:
                break
            time.sleep(0.2)
        assert [j["job_id"] for j in st["jobs"]] == ["73.0"], host.larkd_log()
        p.kill()
        p.wait(10)  # the starter; its job ends on its own listen timeout
    finally:
        pool.close()
