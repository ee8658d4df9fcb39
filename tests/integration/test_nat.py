"""NAT mode on the real kernel, for both firewall backends: reachability, NAT, isolation, counters, teardown."""
import json
import os
import subprocess

import pytest

from helpers.fakehost import HOST_IP, WORLD_IP, sh
from helpers.waits import finished, wait_ready

BACKENDS = ["nftables", "iptables"]


@pytest.fixture(params=BACKENDS)
def fw_host(request, fakehost_factory):
    return fakehost_factory(firewall=request.param)


def assert_counted(s, direction, payload):
    """Counters count IP packets: the payload plus the TCP/IP headers of (GSO) packets the job moved.

    Against what crossed the job's veth at layer 3 (device bytes minus 14 bytes of Ethernet header per
    packet) they must agree within 0.5%; against the payload they can only be larger, by header overhead.
    """
    counted = s[f"bytes_{direction}"]
    l3 = s[f"link_bytes_{direction}"] - 14 * s[f"link_packets_{direction}"]
    assert abs(counted - l3) / l3 < 0.005, (counted, l3, s)
    assert payload <= counted < payload * 1.05, (counted, payload, s)


def test_download_through_nat_counted_and_torn_down(fw_host):
    host = fw_host
    size = 20_000_000
    (host.www / "big.bin").write_bytes(os.urandom(size))
    cp = host.run_job("slot1", ["download", f"http://{WORLD_IP}:8000/big.bin"], job_ad="ClusterId = 7\nProcId = 0")
    assert cp.returncode == 0, cp.stderr + host.larkd_log()
    assert json.loads(cp.stdout)["downloaded"] == size
    s = finished(host, "7.0")
    assert_counted(s, "in", size)
    assert s["bytes_out"] > 0
    assert host.wait_clean() == {k: [] for k in host.residue()}


def test_upload_counted(fw_host):
    host = fw_host
    size = 20_000_000
    cp = host.run_job("slot2", ["upload", WORLD_IP, "7001", str(size)], job_ad="ClusterId = 8\nProcId = 0")
    assert cp.returncode == 0, cp.stderr + host.larkd_log()
    assert json.loads(cp.stdout)["server_counted"] == size
    s = finished(host, "8.0")
    assert_counted(s, "out", size)
    assert host.wait_clean() == {k: [] for k in host.residue()}


def test_world_sees_host_address_not_job(fw_host):
    cp = fw_host.run_job("slot1", ["whoami", WORLD_IP, "7000"])
    assert cp.returncode == 0, cp.stderr + fw_host.larkd_log()
    assert json.loads(cp.stdout)["seen_as"] == HOST_IP


def test_job_gets_its_address_in_env(host):
    cp = host.run_job("slot3", ["env"])
    env = json.loads(cp.stdout)
    assert env["LARK_NETWORK_TYPE"] == "nat"
    assert env["LARK_IPV4_ADDRESS"].startswith("10.213.0.")
    assert "LARK_INBOUND_PORT" not in env


def _connect_from(where, ip, port, timeout=2):
    """What a client in `where` (host.in_world or host.in_host) reads from ip:port, or "ERR ..." if it cannot connect."""
    code = ("import socket,sys\n"
            f"try:\n s=socket.create_connection(('{ip}',{port}),timeout={timeout}); print(s.recv(100).decode().strip())\n"
            "except OSError as e: print('ERR', e)")
    return sh(where(["python3", "-c", code])).stdout.strip()


def _world_connect(host, ip, port, timeout=2):
    return _connect_from(host.in_world, ip, port, timeout)


def test_inbound_refused_by_default(fw_host):
    host = fw_host
    sh(host.in_world(["ip", "route", "add", "10.213.0.0/24", "via", HOST_IP]))
    job = host.spawn_job("slot1", ["listen", "20000", "120"])   # listening all along; killed below
    info = wait_ready(host, "slot1")
    job_ip = info["plan"]["ipv4"]
    job.stdout.readline()
    assert _world_connect(host, job_ip, 20000).startswith("ERR")
    assert _world_connect(host, HOST_IP, 20000).startswith("ERR")
    host.end_job(job, info["netns"])


def _host_connect(host, ip, port, timeout=2):
    return _connect_from(host.in_host, ip, port, timeout)


def test_a_process_on_the_ep_host_cannot_connect_into_a_nat_job(fw_host):
    """Issue 23 item 7: the forward hook never sees a connection from the EP host itself (it is local output),
    so a NAT job without InboundConnectivity was reachable from any process there, uncounted. The job's own
    netns refuses new connections into it, as for bridged jobs; its own connections still get their replies."""
    host = fw_host
    job = host.spawn_job("slot1", ["listen", "20000", "120"])   # listening all along; killed below
    info = wait_ready(host, "slot1")
    job.stdout.readline()
    assert _host_connect(host, info["plan"]["ipv4"], 20000).startswith("ERR")
    host.end_job(job, info["netns"])
    cp = host.run_job("slot2", ["whoami", WORLD_IP, "7000"])   # replies to the job's own connections pass
    assert cp.returncode == 0 and json.loads(cp.stdout)["seen_as"] == HOST_IP, cp.stderr


def test_inbound_allowed_through_host_port(fw_host):
    host = fw_host
    job = host.spawn_job("slot1", ["listen", "0", "60"], job_ad="InboundConnectivity = true")
    info = wait_ready(host, "slot1")
    port = info["plan"]["inbound_port"]
    assert json.loads(job.stdout.readline())["listening"] == port
    assert _world_connect(host, HOST_IP, port) == "hello from job"
    assert job.wait(30) == 0


def test_no_network_means_only_loopback(fw_host):
    ad = "InboundConnectivity = false\nOutboundConnectivity = false"
    cp = fw_host.run_job("slot1", ["links"], job_ad=ad)
    assert json.loads(cp.stdout) == ["lo"], cp.stderr
    cp = fw_host.run_job("slot1", ["connect", WORLD_IP, "8000"], job_ad=ad)
    assert json.loads(cp.stdout)["connected"] is False


def test_outbound_forbidden(fw_host):
    cp = fw_host.run_job("slot1", ["connect", WORLD_IP, "8000"],
                         job_ad="InboundConnectivity = true\nOutboundConnectivity = false")
    assert cp.returncode == 0, cp.stderr
    assert json.loads(cp.stdout)["connected"] is False


def _in_job_ns(host, slot, argv):
    return sh(["nsenter", f"--net=/run/netns/{host.cfg.netns_prefix}{slot}", *argv], check=False)


def test_spoofed_source_dropped(fw_host):
    host = fw_host
    job = host.spawn_job("slot1", ["sleep", "120"])   # killed below
    info = wait_ready(host, "slot1")
    real = info["plan"]["ipv4"]
    # Act as a job that somehow had CAP_NET_ADMIN in its namespace: add a foreign address and send from it.
    assert _in_job_ns(host, "slot1", ["ip", "addr", "add", "10.213.0.250/32", "dev", "eth0"]).returncode == 0
    probe = ("import socket,sys\n"
             "s=socket.socket(); s.settimeout(2); s.bind((sys.argv[1],0))\n"
             f"try:\n s.connect(('{WORLD_IP}',7000)); print(s.recv(100).decode().strip())\n"
             "except OSError as e: print('ERR', e)")
    assert _in_job_ns(host, "slot1", ["python3", "-c", probe, real]).stdout.strip() == HOST_IP
    assert _in_job_ns(host, "slot1", ["python3", "-c", probe, "10.213.0.250"]).stdout.strip().startswith("ERR")
    host.end_job(job, info["netns"])


def test_jobs_cannot_reach_each_other_or_the_host(fw_host):
    host = fw_host
    server = subprocess.Popen(host.in_host(["python3", "-c",
                                            "import socket,time;s=socket.create_server(('0.0.0.0',7100));"
                                            "time.sleep(300)"]))
    host.procs.append(server)
    # A listens all along (three job runs take a while on a loaded machine; an expired listener would make the
    # refusals below prove nothing)
    a = host.spawn_job("slotA", ["listen", "9000", "300"], job_ad="InboundConnectivity = true")
    a_info = wait_ready(host, "slotA")
    a_ip = a_info["plan"]["ipv4"]
    a.stdout.readline()
    for target in (a_ip, HOST_IP, "10.213.0.1"):
        port = 9000 if target == a_ip else 7100
        cp = host.run_job("slotB", ["connect", target, str(port), "1.5"])
        assert json.loads(cp.stdout)["connected"] is False, (target, cp.stdout)
    host.end_job(a, a_info["netns"])


def test_two_jobs_get_distinct_addresses_and_clean_up(host):
    jobs = [host.spawn_job(f"slot{i}", ["env"], job_ad=f"ClusterId = 1\nProcId = {i}") for i in range(6)]
    addrs = []
    for j in jobs:
        out, err = j.communicate(timeout=60)
        assert j.returncode == 0, err
        addrs.append(json.loads(out)["LARK_IPV4_ADDRESS"])
    assert len(set(addrs)) == 6
    assert host.wait_clean() == {k: [] for k in host.residue()}
