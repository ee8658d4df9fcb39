"""One end-to-end job per shipped policy (policies/), on the real pool."""
import subprocess
import time

import pytest

from condor import as_alice, history, job, out_of, submit, testbed

pytestmark = pytest.mark.e2e
IFNAMES = "-c 'import socket; print(sorted(n for _, n in socket.if_nameindex()))'"


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


def test_network_type_policy_no_connectivity_means_only_lo(policy_pool):
    c = submit("pol-none", job(args=IFNAMES, extra="+InboundConnectivity = false\n+OutboundConnectivity = false"))
    assert history(c, ["LarkNetworkType", "ExitCode"]) == ["none", "0"]
    assert out_of("pol-none") == "['lo']"


def test_no_connectivity_job_cannot_reach_the_world(policy_pool):
    probe = f'import socket; s = socket.socket(); s.settimeout(3); print(s.connect_ex(("{testbed.WORLD_IP}", 8000)))'
    c = submit("pol-none-reach", job(args="-c '" + probe.replace('"', '""') + "'",
                                     extra="+InboundConnectivity = false\n+OutboundConnectivity = false"))
    assert history(c, ["LarkNetworkType", "ExitCode"]) == ["none", "0"]
    assert out_of("pol-none-reach") == "101"  # ENETUNREACH: there is no route at all


def test_network_type_policy_outbound_only_is_nat(policy_pool):
    c = submit("pol-nat", job(args=IFNAMES, extra="+OutboundConnectivity = true"))
    assert history(c, ["LarkNetworkType", "ExitCode"]) == ["nat", "0"]
    assert out_of("pol-nat") == "['eth0', 'lo']"


def test_ip_protocol_requirement_matches_ipv4_machine(policy_pool):
    c = submit("pol-ip", job(args=IFNAMES, extra='+IPProtocol = "IPv4"\nrequirements = TARGET.IPProtocol == MY.IPProtocol'))
    assert history(c, ["LarkNetworkType", "ExitCode"]) == ["nat", "0"]


def test_accounting_optional_job_is_counted(policy_pool):
    c = submit("pol-acct", job(args=IFNAMES, extra="+NetworkAccounting = true"))
    mode, inbytes = history(c, ["LarkNetworkType", "NetworkIncomingBytes"])
    assert mode == "nat" and int(inbytes) >= 0


def test_vlan_requirement_does_not_match_machine_without_vlan(policy_pool):
    c = submit("pol-vlan", job(args=IFNAMES, extra='+RequestedVLAN = "physics"\nrequirements = TARGET.VLAN == MY.RequestedVLAN'))
    time.sleep(15)  # several negotiation cycles (NEGOTIATOR_INTERVAL = 2 in minicondor)
    cp = as_alice(["condor_q", str(c), "-af", "JobStatus"])
    assert cp.stdout.strip() == "1"  # idle: never matched, so never ran on the wrong network
    as_alice(["condor_rm", str(c)])
