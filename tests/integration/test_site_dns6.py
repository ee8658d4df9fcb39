"""Issue 17.1 for IPv6 loopback resolvers: the host's resolv.conf says `nameserver ::1` (unbound or dnsmasq on ::1).

The fake EP's host netns runs a dnsmasq on [::1]:53 only, and larkd reads a resolv.conf of the test's own. A job asks
::1 in its own netns, as its libc would, in NAT, bridge and OVS mode: a relay larkd starts in the job's netns answers
from the host's resolver through the forwarder, the bytes are the job's, and the relay is gone with the job.
"""
import json
import os
import shutil

import pytest

from helpers.fakehost import sh
from helpers.sites import MODES
from helpers.waits import finished, wait_ready
from test_site_dns import ANSWER, NAME, WORKLOAD, _kill_pidfile, resolv_dir  # noqa: F401 (fixture)

from lark.kernel import dns6
from lark.kernel.sections import DnsSection


def dnsmasq_pids_in(netns_inode: int) -> list[int]:
    out = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if open(f"/proc/{pid}/comm").read().strip() == "dnsmasq" and \
                    os.stat(f"/proc/{pid}/ns/net").st_ino == netns_inode:
                out.append(int(pid))
        except OSError:
            continue
    return out


def loopback6_site(factory, resolv_dir, mode: str, resolv_text: str):
    if mode == "ovs_bridge" and not shutil.which("ovs-vswitchd"):
        pytest.skip("Open vSwitch is not installed")
    resolv = resolv_dir / "resolv.conf"
    resolv.write_text(resolv_text)
    os.chmod(resolv, 0o644)
    host = factory(resolv_conf=str(resolv), **MODES[mode])
    pid_files = []
    # The host's resolvers on loopback only (unbound's or dnsmasq's `interface: ::1`, systemd-resolved's stub).
    sh(host.in_host(["ip", "link", "set", "lo", "up"]))
    for listen in [a for a in ("127.0.0.53", "::1") if f"nameserver {a}\n" in resolv_text]:
        pid_files.append(str(host.tmp / f"stub-{listen.replace(':', '_')}.pid"))
        sh(host.in_host(["dnsmasq", "--conf-file=/dev/null", f"--pid-file={pid_files[-1]}",
                         f"--listen-address={listen}", "--bind-interfaces", "--no-resolv", "--no-hosts",
                         f"--address=/{NAME}/{ANSWER}"]))
    return host, pid_files


@pytest.fixture(params=list(MODES))
def site6(request, fakehost_factory, resolv_dir):
    host, pid_files = loopback6_site(fakehost_factory, resolv_dir, request.param, "nameserver ::1\n")
    yield request.param, host
    for p in pid_files:
        _kill_pidfile(p)


def test_job_resolves_through_the_hosts_ipv6_loopback_resolver_and_is_counted(site6):
    mode, host = site6
    p = host.spawn_job("slot1", ["sleep", "20"], job_ad="ClusterId = 181\nProcId = 0")
    j = wait_ready(host, "slot1")
    ns = os.path.join(host.cfg.netns_dir, j["netns"])
    inode = os.stat(ns).st_ino
    assert dns6.running_pid(DnsSection.from_config(host.cfg), ns) in dnsmasq_pids_in(inode), host.larkd_log()
    as_job = ["ip", "netns", "exec", j["netns"], "setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
              "/usr/bin/python3", WORKLOAD, "resolve", NAME, "::1"]
    for proto in ("udp", "tcp"):
        got = json.loads(sh([*as_job, proto], check=False).stdout)
        assert got.get("address") == ANSWER, (proto, got, host.larkd_log())
    p.kill()
    p.communicate(timeout=30)
    s = finished(host, "181.0")
    # Two queries and two answers crossed the job's link (the relay forwards over it) and were counted.
    assert s["bytes_out"] > 2 * (20 + 8 + 17 + len(NAME)) and s["bytes_in"] > 2 * (20 + 8 + 33 + len(NAME)), s
    assert host.wait_clean() == {k: [] for k in host.residue()}
    assert dnsmasq_pids_in(inode) == [] and not os.path.exists(dns6.relay_dir(DnsSection.from_config(host.cfg), ns))


def test_ipv4_and_ipv6_loopback_resolvers_together(fakehost_factory, resolv_dir):
    host, pid_files = loopback6_site(fakehost_factory, resolv_dir, "nat", "nameserver 127.0.0.53\nnameserver ::1\n")
    try:
        for server in ("127.0.0.53", "::1"):
            cp = host.run_job("slot1", ["resolve", NAME, server], job_ad="ClusterId = 182\nProcId = 0")
            assert json.loads(cp.stdout).get("address") == ANSWER, (server, cp.stdout, host.larkd_log())
        assert host.wait_clean() == {k: [] for k in host.residue()}
    finally:
        for p in pid_files:
            _kill_pidfile(p)
