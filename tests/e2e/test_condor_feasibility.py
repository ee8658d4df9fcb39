"""Issue 24 item 3: a job this execution point cannot network is held by PREPARE_JOB's check with the reason
(HoldReasonCode 19, subcode 112), before it starts and before larkd builds anything for it. Before, these jobs
passed the check and failed mid-build, after the kernel had changed (a bridge created, addresses reserved)."""
import contextlib
import subprocess
import time

import pytest
from condor import as_root, job, submit, testbed, wait_queue
from condor import starts as starts_of
from test_condor_bridged import restart_larkd

pytestmark = pytest.mark.e2e
HELD = "5"
KNOBS = testbed.ROOT / "etc/condor/config.d/94-lark-feasibility.conf"
POLICY = testbed.ROOT / "etc/condor/config.d/95-feasibility.conf"
# Bridge mode offered (no uplink: nothing of the EP moves even if a bridge were made).
BRIDGE = ("LARK_BRIDGE_NAME = lkbr0\nLARK_BRIDGE_RANGE = 198.51.100.100-198.51.100.149\n"
          "LARK_BRIDGE_GATEWAY = 198.51.100.1\n")


def advertised_case() -> str:
    return as_root(["condor_status", "-af", "LarkFeasibilityCase"]).stdout.strip()


@contextlib.contextmanager
def execution_point(case: str, policy: str, knobs: str = ""):
    """The EP reconfigured for one case: a machine policy (condor_reconfig) and larkd's knobs (a larkd restart),
    restored afterwards. The startd advertises the case's name, so the test waits until its policy is live."""
    POLICY.write_text(f'{policy}LarkFeasibilityCase = "{case}"\nSTARTD_ATTRS = $(STARTD_ATTRS) LarkFeasibilityCase\n')
    KNOBS.write_text(knobs)
    try:
        assert as_root(["condor_reconfig"]).returncode == 0
        if knobs:
            restart_larkd()
        deadline = time.time() + 60
        while advertised_case() != case:
            assert time.time() < deadline, f"the startd never advertised the machine policy of case {case}"
            time.sleep(1)
        yield
    finally:
        POLICY.unlink(missing_ok=True)
        KNOBS.unlink(missing_ok=True)
        as_root(["condor_reconfig"])
        if knobs:
            restart_larkd()
        deadline = time.time() + 60
        while advertised_case() not in ("", "undefined") and time.time() < deadline:
            time.sleep(1)


def held_at_prepare_job(name: str, extra: str) -> str:
    """Submit a job, wait for its hold, check it is PREPARE_JOB's (19/112) and that the job never started, and
    that larkd built nothing for it; return the hold reason."""
    c = submit(name, job(exe="/bin/true", extra=extra))
    try:
        _, reason, code, sub = wait_queue(c, ["JobStatus", "HoldReason", "HoldReasonCode", "HoldReasonSubCode"],
                                          lambda r: r[0] == HELD, timeout=120)
        assert (code, sub) == ("19", "112"), (code, sub, reason)
        # HTCondor puts "Error from <slot>: PREPARE_JOB (lark-prepare-job) failed (reported status 112): " first.
        assert "Lark: job not started, its network was refused: larkd: job " in reason, reason
        assert not any("execute" in events for events in starts_of(c).values()), starts_of(c)
        assert as_root(["lark", "status", "--json"]).stdout.count('"job_id"') == 0  # no record of any job
        bridge = subprocess.run(testbed.in_host(["ip", "link", "show", "lkbr0"]), capture_output=True)
        assert bridge.returncode != 0, "larkd made the bridge for a job it then refused"
        return reason
    finally:
        as_root(["condor_rm", str(c)])


def test_a_vlan_on_a_linux_bridge_is_held_at_prepare_job(pool):
    with execution_point("vlan-on-bridge", 'NetworkType = "bridge"\nVLAN = 10\nSTARTD_ATTRS = $(STARTD_ATTRS) VLAN\n',
                         BRIDGE):
        reason = held_at_prepare_job("feas-vlan", "+RequestedVLAN = 10")
    assert "VLAN 10: bridge mode cannot put a job on a VLAN" in reason and "ovs_bridge" in reason, reason


def test_ipv6_without_a_pool_is_held_at_prepare_job(pool):
    with execution_point("ipv6-without-pool", 'IPProtocol = "IPv4+IPv6"\n'):
        reason = held_at_prepare_job("feas-ipv6", '+IPProtocol = "IPv4+IPv6"')
    assert "the job wants IPv6 but nat mode has no IPv6 pool" in reason and "LARK_SUBNET6" in reason, reason


def test_the_iptables_backend_with_a_bridged_job_is_held_at_prepare_job(pool):
    with execution_point("iptables-bridge", 'NetworkType = "bridge"\n', BRIDGE + "LARK_FIREWALL = iptables\n"):
        reason = held_at_prepare_job("feas-iptables", "")
    assert "firewall = iptables: bridge mode needs the nftables firewall backend" in reason, reason
