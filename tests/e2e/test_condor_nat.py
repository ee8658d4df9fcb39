"""End to end through a real HTCondor pool (testbed/testbed.py): submit, run, read condor_history."""
import pytest

from condor import history, job, submit, testbed

pytestmark = pytest.mark.e2e


def test_default_job_gets_nat_and_history_has_its_bytes(pool):
    size = 10_000_000
    url = f"http://{testbed.WORLD_IP}:8000/10M.bin"
    script = f'import urllib.request; print(len(urllib.request.urlopen("{url}").read()))'
    cluster = submit("nat", job(args="-c '" + script.replace('"', '""') + "'"))
    mode, addr, inbytes, outbytes, code = history(cluster, ["LarkNetworkType", "LarkIPv4Address",
                                                            "NetworkIncomingBytes", "NetworkOutgoingBytes",
                                                            "ExitCode"])
    assert (mode, code) == ("nat", "0")
    assert addr.startswith("10.213.0.")
    # IP bytes counted include HTTP and TCP/IP headers: at least the file, at most 2% more.
    assert size <= int(inbytes) < size * 1.02
    assert 0 < int(outbytes) < 200_000  # the request and ACKs only
