"""Issue 17.1: a host whose resolv.conf points at a loopback resolver (systemd-resolved's 127.0.0.53 stub).

The fake EP's host netns runs a dnsmasq on 127.0.0.53 only (the site's stub), and larkd reads a resolv.conf of
the test's own (nameserver 127.0.0.53; the machine's /etc/resolv.conf is never touched). A job asks
127.0.0.53 in its own netns, as its libc would with that resolv.conf, in NAT, bridge and OVS mode.
"""
import json
import os
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path

import pytest

from helpers.sites import MODES
from helpers.fakehost import HOST_IP, WORLD_IP, sh
from helpers.waits import finished, wait_ready

NAME, ANSWER = "compute.lark-site.test", "192.0.2.77"
WORKLOAD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "helpers", "workload.py")
HOST_SERVICE_PORT = 7711  # a host-local TCP service the job must not reach


def _kill_pidfile(path: str) -> None:
    try:
        os.kill(int(open(path).read().strip()), signal.SIGTERM)
    except (OSError, ValueError):
        pass


@pytest.fixture
def resolv_dir():
    # dnsmasq reads the file after dropping root: pytest's own tmp dirs (0700) would hide it.
    d = tempfile.mkdtemp(prefix="lark-resolv-", dir="/tmp")
    os.chmod(d, 0o755)
    yield Path(d)
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(params=list(MODES))
def site(request, fakehost_factory, resolv_dir):
    mode = request.param
    if mode == "ovs_bridge" and not shutil.which("ovs-vswitchd"):
        pytest.skip("Open vSwitch is not installed")
    resolv = resolv_dir / "resolv.conf"
    resolv.write_text("# what systemd-resolved writes\nnameserver 127.0.0.53\noptions edns0 trust-ad\n")
    os.chmod(resolv, 0o644)
    host = fakehost_factory(resolv_conf=str(resolv), **MODES[mode])
    stub_pid = host.tmp / "stub.pid"
    # The site's stub resolver: loopback only, like systemd-resolved.
    sh(host.in_host(["dnsmasq", "--conf-file=/dev/null", f"--pid-file={stub_pid}", "--listen-address=127.0.0.53",
                     "--bind-interfaces", "--no-resolv", "--no-hosts", f"--address=/{NAME}/{ANSWER}"]))
    # Host-local services: on loopback and on every address of the host.
    service = subprocess.Popen(host.in_host(["python3", "-c",
                                             "import socket,time; s=socket.create_server(('0.0.0.0', %d));"
                                             "time.sleep(120)" % HOST_SERVICE_PORT]))
    host.procs.append(service)
    yield mode, host
    _kill_pidfile(str(stub_pid))


def _job(host, slot, cluster, workload):
    cp = host.run_job(slot, workload, job_ad=f"ClusterId = {cluster}\nProcId = 0")
    assert cp.returncode == 0, cp.stderr + host.larkd_log()
    return json.loads(cp.stdout)


def test_job_resolves_through_the_hosts_loopback_resolver_and_is_counted(site):
    mode, host = site
    got = _job(host, "slot1", 171, ["resolve", NAME, "127.0.0.53", "udp"])
    assert got.get("address") == ANSWER, (got, host.larkd_log())
    s = finished(host, "171.0")
    # The query and the answer cross the job's link and land in its counters (IP bytes: > the DNS payloads).
    assert s["bytes_out"] > 20 + 8 + 17 + len(NAME) and s["bytes_in"] > 20 + 8 + 33 + len(NAME), s
    got = _job(host, "slot1", 172, ["resolve", NAME, "127.0.0.53", "tcp"])
    assert got.get("address") == ANSWER, (got, host.larkd_log())
    assert host.wait_clean() == {k: [] for k in host.residue()}


def test_job_reaches_nothing_else_on_the_host(site):
    mode, host = site
    p = host.spawn_job("slot2", ["sleep", "12"], job_ad="ClusterId = 173\nProcId = 0")
    j = wait_ready(host, "slot2")
    ns = j["netns"]
    # Run as the job's user inside the job's netns (the job's own view).
    probe = ["ip", "netns", "exec", ns, "setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
             "/usr/bin/python3", "-c", "import socket,sys\ntry:\n socket.create_connection((sys.argv[1], int(sys.argv[2])), 2)"
             "\n print('open')\nexcept OSError as e:\n print('closed', e)"]
    dns = host.cfg.dns_address
    gateway = str(host.cfg.gateway) if mode == "nat" else HOST_IP
    for addr, port in ((dns, HOST_SERVICE_PORT), (gateway, HOST_SERVICE_PORT), (HOST_IP, HOST_SERVICE_PORT),
                       ("127.0.0.1", HOST_SERVICE_PORT), ("127.0.0.53", HOST_SERVICE_PORT)):
        cp = sh([*probe, addr, str(port)], check=False)
        assert cp.stdout.startswith("closed"), (addr, port, cp.stdout, cp.stderr)
    # The DNS path itself stays open in the same setup (the probe above is not failing for another reason).
    q = sh(["ip", "netns", "exec", ns, "setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "/usr/bin/python3",
            WORKLOAD, "resolve", NAME, "127.0.0.53"], check=False)
    assert json.loads(q.stdout).get("address") == ANSWER, q.stdout + q.stderr
    p.communicate(timeout=30)


def test_site_neighbour_cannot_use_the_forwarder(site):
    mode, host = site
    _job(host, "slot3", 174, ["resolve", NAME, "127.0.0.53"])  # the forwarder exists from the first job on
    # A machine on the site network sends to the forwarder's address through the host.
    sh(host.in_world(["ip", "route", "replace", f"{host.cfg.dns_address}/32", "via", HOST_IP]), check=False)
    got = json.loads(sh(host.in_world(["python3", WORKLOAD, "resolve", NAME, host.cfg.dns_address])).stdout)
    assert "error" in got, got


def test_no_loopback_resolver_means_nothing_is_steered(fakehost_factory, resolv_dir):
    resolv = resolv_dir / "resolv.conf"
    resolv.write_text(f"nameserver {WORLD_IP}\n")
    host = fakehost_factory(resolv_conf=str(resolv))
    p = host.spawn_job("slot1", ["sleep", "3"], job_ad="ClusterId = 175\nProcId = 0")
    j = wait_ready(host, "slot1")
    assert "lark_dns" not in sh(["ip", "netns", "exec", j["netns"], "nft", "list", "tables"]).stdout
    assert "lkdns0" not in sh(host.in_host(["ip", "-o", "link"])).stdout
    p.communicate(timeout=20)


def test_iptables_backend_lets_nat_jobs_reach_the_forwarder(fakehost_factory, resolv_dir):
    resolv = resolv_dir / "resolv.conf"
    resolv.write_text("nameserver 127.0.0.53\n")
    host = fakehost_factory(resolv_conf=str(resolv), firewall="iptables")
    pid = host.tmp / "stub.pid"
    sh(host.in_host(["dnsmasq", "--conf-file=/dev/null", f"--pid-file={pid}", "--listen-address=127.0.0.53",
                     "--bind-interfaces", "--no-resolv", "--no-hosts", f"--address=/{NAME}/{ANSWER}"]))
    try:
        got = _job(host, "slot1", 176, ["resolve", NAME, "127.0.0.53"])
        assert got.get("address") == ANSWER, (got, host.larkd_log())
    finally:
        _kill_pidfile(str(pid))
