"""Issue 23 item 9: the DNS forwarder (lark/kernel/dns.py) must not bypass a job's policy or let one job hurt others.

The fake EP's host resolver is a dnsmasq stub on 127.0.0.53 (as in test_site_dns.py) that forwards, as a host's
resolver does: NAME to a server on 127.0.0.54 that answers it, `flood.test` to one that never answers (an
attacker's zone whose server stalls). Every flood.test query holds an entry of the forwarder's table of pending
queries for its one upstream (the stub) until it times out; with that table full, the forwarder refuses every
job's lookups. The stub holds more pending queries than the forwarder (systemd-resolved holds 4096), so the
forwarder's table is the one that fills.
Each test performs the attack; each says what it got before the fix.
"""
import json
import os
import secrets
import shutil
import signal
import subprocess

import pytest

from helpers.fakehost import sh
from helpers.sites import MODES
from helpers.waits import finished, wait_ready
from test_site_dns import ANSWER, NAME, WORKLOAD, _kill_pidfile, resolv_dir  # noqa: F401 (fixture)
from test_site_dns6 import loopback6_site

from lark.kernel import dns, dns6
from lark.kernel.sections import DnsSection

BLACK_HOLE = "127.0.0.99"  # nothing listens there: the stub's queries for flood.test are never answered
UPSTREAM = "127.0.0.54"    # the site's nameserver for NAME
STUB_PENDING = 4 * dns.FORWARD_MAX  # the host resolver's table of pending queries (dnsmasq's --dns-forward-max)
NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]


def _stub_site(factory, resolv_dir, mode: str, **kw):
    if mode == "ovs_bridge" and not shutil.which("ovs-vswitchd"):
        pytest.skip("Open vSwitch is not installed")
    resolv = resolv_dir / "resolv.conf"
    resolv.write_text("nameserver 127.0.0.53\n")
    os.chmod(resolv, 0o644)
    host = factory(resolv_conf=str(resolv), **MODES[mode], **kw)
    pids = [str(host.tmp / "upstream.pid"), str(host.tmp / "stub.pid")]
    sh(host.in_host(["dnsmasq", "--conf-file=/dev/null", f"--pid-file={pids[0]}", f"--listen-address={UPSTREAM}",
                     "--bind-interfaces", "--no-resolv", "--no-hosts", f"--address=/{NAME}/{ANSWER}"]))
    sh(host.in_host(["dnsmasq", "--conf-file=/dev/null", f"--pid-file={pids[1]}", "--listen-address=127.0.0.53",
                     "--bind-interfaces", "--no-resolv", "--no-hosts", f"--server=/{NAME}/{UPSTREAM}",
                     f"--server=/flood.test/{BLACK_HOLE}", f"--dns-forward-max={STUB_PENDING}", "--cache-size=0"]))
    return host, pids


@pytest.fixture
def stub_site(fakehost_factory, resolv_dir):
    pids = []

    def make(mode: str, **kw):
        host, started = _stub_site(fakehost_factory, resolv_dir, mode, **kw)
        pids.extend(started)
        return host
    yield make
    for p in pids:
        _kill_pidfile(p)


def _in_job(ns: str, *argv: str) -> list[str]:
    """argv as the job's user (nobody) in the job's netns: the job's own view."""
    return ["ip", "netns", "exec", ns, *NOBODY, *argv]


def _end_job(p, ns: str) -> None:
    """End a sleeping job now: its processes (the job's user's, in its netns; not larkd's relay) by pid."""
    for pid in sh(["ip", "netns", "pids", ns]).stdout.split():
        try:
            if os.stat(f"/proc/{pid}").st_uid == 65534:
                os.kill(int(pid), signal.SIGKILL)
        except OSError:
            continue  # already gone
    p.communicate(timeout=30)


def _resolve(ns: str, server: str, proto: str = "udp") -> dict:
    cp = sh(_in_job(ns, "/usr/bin/python3", WORKLOAD, "resolve", NAME, server, proto), check=False)
    return json.loads(cp.stdout) if cp.stdout.strip() else {"error": cp.stderr}


@pytest.mark.parametrize("mode", ["nat", "bridge", "ovs_bridge"])
def test_a_job_without_outbound_connectivity_gets_no_dns(stub_site, mode):
    """Attack: a job the policy gave no outbound network (InboundConnectivity only) sends its data out as query
    names; the forwarder would carry them to the host's resolver and on to any zone's server. Before the fix it
    resolved through 127.0.0.53 and the forwarder's address alike."""
    host = stub_site(mode)
    closed = host.spawn_job("slot1", ["sleep", "60"],
                            job_ad="ClusterId = 191\nProcId = 0\nOutboundConnectivity = false\n"
                                   "InboundConnectivity = true")
    ns_closed = wait_ready(host, "slot1")["netns"]
    # The control: a job with outbound connectivity on the same EP resolves.
    p = host.spawn_job("slot2", ["sleep", "60"], job_ad="ClusterId = 192\nProcId = 0")
    ns_open = wait_ready(host, "slot2")["netns"]
    assert _resolve(ns_open, "127.0.0.53").get("address") == ANSWER, host.larkd_log()
    _assert_no_dns(host, ns_closed, ("udp", "tcp"))
    _end_job(closed, ns_closed)
    _end_job(p, ns_open)


def _assert_no_dns(host, ns: str, protos: tuple[str, ...]) -> None:
    """Lookups steered (127.0.0.53) and straight to the forwarder fail, all at once (each waits out a 3 s timeout)."""
    probes = {(server, proto): subprocess.Popen(
        _in_job(ns, "/usr/bin/python3", WORKLOAD, "resolve", NAME, server, proto), stdout=subprocess.PIPE,
        text=True) for server in ("127.0.0.53", host.cfg.dns_address) for proto in protos}
    for what, probe in probes.items():
        got = json.loads(probe.communicate(timeout=30)[0])
        assert "error" in got, (what, got)


@pytest.mark.skipif(not shutil.which("ovs-vswitchd"), reason="Open vSwitch is not installed")
def test_a_job_the_pool_controller_drops_gets_no_dns(fakehost_factory, resolv_dir, tmp_path):
    """Attack: the pool controller drops all of mallory's traffic and eve's WAN traffic at the core switch, but the
    forwarder is on the EP, before that switch, and resolves through the host: query names would be their way out.
    Before the fix both resolved."""
    from helpers.sdn import SdnPool
    from test_controller_larkd import AD, ep_host
    resolv = resolv_dir / "resolv.conf"
    resolv.write_text("nameserver 127.0.0.53\n")
    os.chmod(resolv, 0o644)
    host, ports = ep_host(fakehost_factory, tmp_path, resolv_conf=str(resolv))
    stub = str(host.tmp / "stub.pid")
    sh(host.in_host(["dnsmasq", "--conf-file=/dev/null", f"--pid-file={stub}", "--listen-address=127.0.0.53",
                     "--bind-interfaces", "--no-resolv", "--no-hosts", f"--address=/{NAME}/{ANSWER}"]))
    pool = SdnPool(str(ports.tmp), core_ns=host.host_ns, policies="""
[[policy]]
name = "quarantine"
kind = "drop"
select = 'Owner =?= "mallory"'
[[policy]]
name = "no-wan"
kind = "wan_drop"
select = 'Owner =?= "eve"'
""")
    pool.of_port, pool.api_port = ports.of_port, ports.api_port
    pool.start()
    try:
        jobs = {}
        for n, owner in ((197, "alice"), (198, "mallory"), (199, "eve")):
            slot = f"slot{n - 196}"
            p = host.spawn_job(slot, ["sleep", "60"], job_ad=AD.format(n=n).replace('"alice"', f'"{owner}"'))
            jobs[owner] = (p, wait_ready(host, slot)["netns"])
        assert _resolve(jobs["alice"][1], "127.0.0.53").get("address") == ANSWER, host.larkd_log()
        for owner in ("mallory", "eve"):
            _assert_no_dns(host, jobs[owner][1], ("udp",))
        assert "policy quarantine drops its traffic" in host.larkd_log()
        for p, ns in jobs.values():
            _end_job(p, ns)
    finally:
        pool.close()
        ports.close()
        _kill_pidfile(stub)


def _flood(ns: str, count: int) -> list[str]:
    """`count` queries for distinct names under flood.test from the job, 2500 a second: faster, most would be lost
    in the forwarder's socket buffer instead of filling its table."""
    code = ("import socket, struct, sys, time\n"
            "s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
            "for i in range(int(sys.argv[1])):\n"
            "    if i % 50 == 0:\n"
            "        time.sleep(0.02)\n"
            "    q = struct.pack('>HHHHHH', i & 0xffff, 0x0100, 1, 0, 0, 0)\n"
            "    for label in (f'q{i}', sys.argv[2], 'flood', 'test'):\n"
            "        q += bytes([len(label)]) + label.encode()\n"
            "    s.sendto(q + b'\\0' + struct.pack('>HH', 1, 1), ('127.0.0.53', 53))\n")
    return _in_job(ns, "/usr/bin/python3", "-c", code, str(count), secrets.token_hex(4))


@pytest.mark.parametrize("mode", ["nat", "bridge", "ovs_bridge"])
def test_one_jobs_query_flood_does_not_starve_another_jobs_lookups(stub_site, mode):
    """Attack: one job sends more queries (for a zone whose server stalls) than the forwarder holds at once; while
    they wait, every other job's lookups are refused ("Maximum number of concurrent DNS queries reached"). Before
    the fix the victim's three lookups after the flood were all refused."""
    host = stub_site(mode)
    flooder = host.spawn_job("slot1", ["sleep", "60"], job_ad="ClusterId = 193\nProcId = 0")
    ns_flood = wait_ready(host, "slot1")["netns"]
    victim = host.spawn_job("slot2", ["sleep", "60"], job_ad="ClusterId = 194\nProcId = 0")
    ns_victim = wait_ready(host, "slot2")["netns"]
    assert _resolve(ns_victim, "127.0.0.53").get("address") == ANSWER, host.larkd_log()
    # More queries than the forwarder's table of pending ones (which the fix raised), in well under its timeout.
    sh(_flood(ns_flood, dns.FORWARD_MAX + 500))
    got = [_resolve(ns_victim, "127.0.0.53") for _ in range(3)]
    assert all(g.get("address") == ANSWER for g in got), (got, host.larkd_log())
    _end_job(flooder, ns_flood)
    _end_job(victim, ns_victim)


def test_a_job_running_as_nobody_cannot_signal_the_forwarder_or_a_relay(fakehost_factory, resolv_dir):
    """Attack: a job of a slot that runs jobs as nobody (the default for jobs without a local account) sends
    SIGTERM to the host's DNS forwarder (every job's name resolution) and to another job's ::1 relay. Before the
    fix both ran as nobody and both died."""
    host, pid_files = loopback6_site(fakehost_factory, resolv_dir, "nat", "nameserver 127.0.0.53\nnameserver ::1\n")
    try:
        p = host.spawn_job("slot1", ["sleep", "60"], job_ad="ClusterId = 195\nProcId = 0")
        ns = wait_ready(host, "slot1")["netns"]
        assert _resolve(ns, "127.0.0.53").get("address") == ANSWER, host.larkd_log()
        forwarder = dns.Forwarder(DnsSection.from_config(host.cfg)).running_pid()
        relay = dns6.running_pid(DnsSection.from_config(host.cfg), os.path.join(host.cfg.netns_dir, ns))
        assert forwarder and relay, host.larkd_log()
        for pid in (forwarder, relay):
            cp = sh([*NOBODY, "/usr/bin/python3", "-c",
                     "import os, sys\ntry:\n os.kill(int(sys.argv[1]), int(sys.argv[2])); print('signalled')\n"
                     "except OSError as e:\n print(e.strerror)", str(pid), str(int(signal.SIGTERM))], check=False)
            assert cp.stdout.strip() == "Operation not permitted", (pid, cp.stdout, cp.stderr)
            assert os.path.exists(f"/proc/{pid}")
        owner = os.stat(f"/proc/{forwarder}").st_uid
        assert owner not in (0, 65534) and owner == os.stat(f"/proc/{relay}").st_uid
        assert _resolve(ns, "127.0.0.53").get("address") == ANSWER and _resolve(ns, "::1").get("address") == ANSWER
        _end_job(p, ns)
    finally:
        for f in pid_files:
            _kill_pidfile(f)


@pytest.mark.parametrize("firewall", ["nftables", "iptables"])
def test_a_jobs_lookups_are_counted_by_both_firewall_backends(stub_site, firewall):
    """Before the fix the iptables backend counted none of a NAT job's DNS bytes (the nftables one did)."""
    host = stub_site("nat", firewall=firewall)
    for cluster, proto in ((196, "udp"), (197, "tcp")):
        cp = host.run_job("slot1", ["resolve", NAME, "127.0.0.53", proto], job_ad=f"ClusterId = {cluster}\nProcId = 0")
        assert json.loads(cp.stdout).get("address") == ANSWER, (cp.stdout, cp.stderr, host.larkd_log())
        s = finished(host, f"{cluster}.0")
        # IP bytes of the query and of the answer, at least (TCP adds its handshake and length prefixes).
        assert s["bytes_out"] >= 20 + 8 + 17 + len(NAME) and s["bytes_in"] >= 20 + 8 + 33 + len(NAME), (proto, s)
