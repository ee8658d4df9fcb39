"""AddressType = dhcp on the real kernel: larkd runs the DHCP client for the job against a real dnsmasq in the
world namespace, caches the lease per slot, renews it, and releases it when configured to."""
import json
import os
import subprocess

import pytest
from helpers.fakehost import WORLD_IP
from helpers.waits import finished, wait_for, wait_ready, wait_until

BASE = dict(bridge_name="lkbr0", bridge_uplink="up0", bridge_range="198.51.100.100-198.51.100.149",
            bridge_prefix=24, bridge_gateway=WORLD_IP)
DHCP_AD = 'AddressType = "dhcp"'


def start_dnsmasq(host):
    log = host.tmp / "dnsmasq.log"
    p = subprocess.Popen(host.in_world([
        "dnsmasq", "--keep-in-foreground", "--no-ping", "--port=0", "--user=root", "--interface=w0",
        "--bind-interfaces", "--dhcp-range=198.51.100.150,198.51.100.199,255.255.255.0,2m",
        f"--dhcp-leasefile={host.tmp}/dnsmasq.leases", "--dhcp-authoritative", f"--dhcp-option=3,{WORLD_IP}",
        "--log-dhcp", f"--log-facility={log}", "--conf-file=/dev/null", "--pid-file="]),
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    host.procs.append(p)
    wait_until(lambda: log.exists() and "started" in log.read_text(), "dnsmasq to log that it started",
               detail=lambda: p.stderr.read() if p.poll() is not None and p.stderr else "")
    return log


@pytest.fixture(params=["bridge", "ovs_bridge"])
def dhost(request, fakehost_factory):
    extra = dict(ovs=True, ovs_uplink="up0", ovs_datapath="netdev") if request.param == "ovs_bridge" else {}
    host = fakehost_factory(default_network_type=request.param, **BASE, **extra)
    host.dnsmasq_log = start_dnsmasq(host)
    return host


def messages(log, kind):
    return [line for line in log.read_text().splitlines() if f"DHCP{kind}(" in line]


def test_dhcp_address_from_server_then_cached_for_the_slots_next_job(dhost):
    dhost.publish_ad("slot1", "ClusterId = 71\nProcId = 0", DHCP_AD)
    cp = dhost.run_job("slot1", ["whoami", WORLD_IP, "7000"], job_ad="ClusterId = 71\nProcId = 0")
    assert cp.returncode == 0, cp.stderr + dhost.larkd_log()
    first = json.loads(cp.stdout)["seen_as"]
    assert first.startswith("198.51.100.1") and 150 <= int(first.rsplit(".", 1)[1]) <= 199, first
    s = finished(dhost, "71.0")
    assert s["ipv4"] == first
    discovers = len(messages(dhost.dnsmasq_log, "DISCOVER"))
    assert discovers >= 1
    # The slot's next job reuses the lease: same address, and the server saw no new DISCOVER.
    dhost.publish_ad("slot1", "ClusterId = 72\nProcId = 0", DHCP_AD)
    cp = dhost.run_job("slot1", ["whoami", WORLD_IP, "7000"], job_ad="ClusterId = 72\nProcId = 0")
    assert cp.returncode == 0, cp.stderr + dhost.larkd_log()
    assert json.loads(cp.stdout)["seen_as"] == first
    assert len(messages(dhost.dnsmasq_log, "DISCOVER")) == discovers
    assert dhost.wait_clean() == {k: [] for k in dhost.residue()}


def test_dhcp_lease_is_recorded_and_renewed(fakehost_factory):
    host = fakehost_factory(default_network_type="bridge", dhcp_renew_interval=1.0, **BASE)
    log = start_dnsmasq(host)
    host.publish_ad("slot2", "ClusterId = 73\nProcId = 0", DHCP_AD)
    p = host.spawn_job("slot2", ["listen", "9000", "120"], job_ad="ClusterId = 73\nProcId = 0")   # killed below
    j = wait_ready(host, "slot2")
    lease = j["plan"]["dhcp"]
    assert lease["server"] == WORLD_IP and lease["address"] == j["plan"]["ipv4"] and lease["lease_time"] == 120
    wait_for(lambda: [m for m in messages(log, "ACK") if lease["address"] in m][1:])
    acks = [m for m in messages(log, "ACK") if lease["address"] in m]
    assert len(acks) >= 2, log.read_text()  # the first lease, then at least one renewal
    renewed = wait_ready(host, "slot2")["plan"]["dhcp"]
    assert renewed["obtained"] > lease["obtained"] and renewed["address"] == lease["address"]
    host.end_job(p, j["netns"])


def test_dhcp_release_when_configured(fakehost_factory):
    host = fakehost_factory(default_network_type="bridge", dhcp_release=True, **BASE)
    log = start_dnsmasq(host)
    host.publish_ad("slot3", "ClusterId = 74\nProcId = 0", DHCP_AD)
    cp = host.run_job("slot3", ["env"], job_ad="ClusterId = 74\nProcId = 0")
    assert cp.returncode == 0, cp.stderr + host.larkd_log()
    wait_until(lambda: messages(log, "RELEASE"), "dnsmasq to log the job's DHCPRELEASE", detail=log.read_text)
    assert not os.path.exists(os.path.join(host.cfg.state_dir, "leases", "slot3.lease"))


def test_no_dhcp_server_is_a_clear_error(fakehost_factory):
    host = fakehost_factory(default_network_type="bridge", **BASE)
    host.publish_ad("slot4", "ClusterId = 75\nProcId = 0", DHCP_AD)
    cp = host.run_job("slot4", ["env"], job_ad="ClusterId = 75\nProcId = 0", timeout=90)
    assert cp.returncode == 111
    assert "no DHCP answer" in cp.stderr and "75.0" in cp.stderr
    assert host.wait_clean() == {k: [] for k in host.residue()}
