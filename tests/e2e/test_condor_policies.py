"""One end-to-end job per shipped policy (policies/), on the real pool."""
import subprocess
import time

import pytest

from test_condor_nat import as_alice, history, submit, testbed  # noqa: F401  (shared fixture helpers)
from test_condor_nat import pool  # noqa: F401

pytestmark = pytest.mark.e2e
SUB = """executable = /usr/bin/python3
arguments = "-c 'import socket; print(sorted(n for _, n in socket.if_nameindex()))'"
output = out.txt
error = err.txt
log = log.txt
should_transfer_files = NO
{extra}
queue
"""


@pytest.fixture(scope="module")
def policy_pool(pool):  # noqa: F811
    conf = testbed.ROOT / "etc/condor/config.d/95-policy.conf"
    expr = (testbed.REPO / "policies/network_type_by_connectivity.ad").read_text().strip().splitlines()[-1]
    conf.write_text(f"{expr}\n")
    subprocess.run(testbed.in_root(["condor_reconfig"]), check=True, capture_output=True)
    time.sleep(5)
    yield pool
    conf.unlink()
    subprocess.run(testbed.in_root(["condor_reconfig"]), capture_output=True)


def out_of(name):
    return (testbed.ROOT / "home/alice" / name / "out.txt").read_text().strip()


def test_network_type_policy_no_connectivity_means_only_lo(policy_pool):
    c = submit(policy_pool, "pol-none", SUB.format(extra="+InboundConnectivity = false\n+OutboundConnectivity = false"))
    assert history(c, ["LarkNetworkType", "ExitCode"]) == ["none", "0"]
    assert out_of("pol-none") == "['lo']"


def test_network_type_policy_outbound_only_is_nat(policy_pool):
    c = submit(policy_pool, "pol-nat", SUB.format(extra="+OutboundConnectivity = true"))
    assert history(c, ["LarkNetworkType", "ExitCode"]) == ["nat", "0"]
    assert out_of("pol-nat") == "['eth0', 'lo']"


def test_ip_protocol_requirement_matches_ipv4_machine(policy_pool):
    c = submit(policy_pool, "pol-ip", SUB.format(extra='+IPProtocol = "IPv4"\nrequirements = TARGET.IPProtocol == MY.IPProtocol'))
    assert history(c, ["LarkNetworkType", "ExitCode"]) == ["nat", "0"]


def test_accounting_optional_job_is_counted(policy_pool):
    c = submit(policy_pool, "pol-acct", SUB.format(extra="+NetworkAccounting = true"))
    mode, inbytes = history(c, ["LarkNetworkType", "NetworkIncomingBytes"])
    assert mode == "nat" and int(inbytes) >= 0


def test_vlan_requirement_does_not_match_machine_without_vlan(policy_pool):
    c = submit(policy_pool, "pol-vlan", SUB.format(extra='+RequestedVLAN = "physics"\nrequirements = TARGET.VLAN == MY.RequestedVLAN'))
    time.sleep(15)  # several negotiation cycles (NEGOTIATOR_INTERVAL = 2 in minicondor)
    cp = as_alice(["condor_q", str(c), "-af", "JobStatus"])
    assert cp.stdout.strip() == "1"  # idle: never matched, so never ran on the wrong network
    as_alice(["condor_rm", str(c)])
