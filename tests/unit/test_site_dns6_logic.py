"""Issue 17.1 for IPv6 loopback resolvers: which nameservers get a relay, the relay's command line, and what
setup does when the job has no IPv4 or the relay cannot start."""
import dataclasses
import os
import pwd

from lark.config import Config
from lark.errors import LarkError
from lark.kernel import dns, dns6
from lark.kernel.sections import DnsSection

# dns_user for these tests: the user running them, who exists on every host (the default, lark-dns, exists only
# where Lark was installed, and a unit test must not depend on an install or an earlier test having made it).
EXISTING_USER = pwd.getpwuid(os.getuid()).pw_name
RESOLV = "nameserver ::1\nnameserver 127.0.0.53\nnameserver 2001:db8::53\nnameserver ::1\nnameserver fe80::1%eth0\n"


def _forwarder(tmp_path, text: str) -> dns.Forwarder:
    p = tmp_path / "resolv.conf"
    p.write_text(text)
    return dns.Forwarder(DnsSection.from_config(Config(resolv_conf=str(p), run_dir=str(tmp_path),
                                                       dns_user=EXISTING_USER)))


def test_ipv6_loopback_nameservers_are_found_apart_from_the_ipv4_ones(tmp_path):
    fwd = _forwarder(tmp_path, RESOLV)
    assert fwd.wanted == ["127.0.0.53"] and fwd.wanted6 == ["::1"]
    assert "::1" in dns.forwarder_status(fwd.cfg) and "127.0.0.53" in dns.forwarder_status(fwd.cfg)
    fwd.cfg = dataclasses.replace(fwd.cfg, dns_forward=False)  # a frozen section (lark/kernel/sections.py)
    assert fwd.wanted6 == []


def test_relay_listens_on_the_ipv6_loopback_only_and_forwards_to_the_hosts_forwarder(tmp_path):
    cfg = DnsSection.from_config(Config(run_dir=str(tmp_path), dns_address="169.254.53.53", dns_user=EXISTING_USER))
    argv = dns6.relay_argv(cfg, "/run/netns/lark-slot1", ["::1"])
    assert argv[:3] == ["nsenter", "--net=/run/netns/lark-slot1", "dnsmasq"]
    assert [a for a in argv if a.startswith("--listen-address")] == ["--listen-address=::1"]
    assert "--bind-interfaces" in argv and "--no-resolv" in argv and "--server=169.254.53.53" in argv
    assert not any(a.startswith("--interface") for a in argv)  # that would add lo's 127.0.0.1 too
    assert f"--pid-file={dns6.relay_dir(cfg, '/run/netns/lark-slot1')}/dnsmasq.pid" in argv
    assert f"--user={EXISTING_USER}" in argv  # the relay drops root for dns_user


def test_host_forwarder_does_not_listen_on_loopback(tmp_path):
    # With --interface, dnsmasq adds lo (127.0.0.1, ::1): where the host's own resolver may be listening.
    argv = _forwarder(tmp_path, RESOLV).argv()
    assert not any(a.startswith("--interface") for a in argv)
    assert [a for a in argv if a.startswith("--listen-address")] == ["--listen-address=169.254.53.53"]


def test_ipv6_only_resolvers_route_a_bridged_job_to_the_forwarder_and_start_a_relay(tmp_path, monkeypatch):
    fwd = _forwarder(tmp_path, "nameserver ::1\n")
    monkeypatch.setattr(fwd, "ensure", lambda ipr: None)
    monkeypatch.setattr(dns, "host_address_on", lambda ipr, dev: "192.0.2.2")
    calls = []
    monkeypatch.setattr(dns, "steer_job", lambda *a: calls.append(("steer",)))
    monkeypatch.setattr(dns, "route_to_forwarder", lambda fd, idx, service, via: calls.append(("route", via)))
    monkeypatch.setattr(dns6, "start_relay", lambda cfg, path, listen, job: calls.append(("relay", listen)))
    assert dns.setup_job(fwd, None, "lkbr0", "192.0.2.100", -1, "/x", "eth0", 2, "8.0") == ["::1"]
    assert calls == [("route", "192.0.2.2"), ("relay", ["::1"])]  # no IPv4 DNAT table: nothing to steer


def test_no_ipv4_or_a_failed_relay_leaves_the_job_running_with_a_log_line(tmp_path, monkeypatch, caplog):
    fwd = _forwarder(tmp_path, "nameserver 127.0.0.53\nnameserver ::1\n")
    monkeypatch.setattr(fwd, "ensure", lambda ipr: None)
    monkeypatch.setattr(dns, "steer_job", lambda *a: None)
    assert dns.setup_job(fwd, None, None, None, -1, "/x", "eth0", 2, "9.0") == []
    assert "job 9.0 has no IPv4 address" in caplog.text

    def broken(*a):
        raise LarkError("dnsmasq did not start in the job's netns", job="9.0", obj="DNS relay")
    monkeypatch.setattr(dns6, "start_relay", broken)
    assert dns.setup_job(fwd, None, None, "10.213.0.2", -1, "/x", "eth0", 2, "9.0") == ["127.0.0.53"]
    assert "no DNS relay" in caplog.text and "dnsmasq did not start" in caplog.text


def test_stopping_a_relay_that_never_ran_is_safe(tmp_path):
    cfg = DnsSection.from_config(Config(run_dir=str(tmp_path)))
    assert dns6.stop_relay(cfg, "/run/netns/lark-slot1") is False
    d = dns6.relay_dir(cfg, "/run/netns/lark-slot1")
    os.makedirs(d)
    with open(os.path.join(d, "netns_inode"), "w") as f:
        f.write(str(os.stat(f"/proc/{os.getpid()}/ns/net").st_ino))
    with open(os.path.join(d, "dnsmasq.pid"), "w") as f:
        f.write(str(os.getpid()))  # a reused pid in the right netns that is not a dnsmasq: never signalled
    assert dns6.stop_relay(cfg, "/run/netns/lark-slot1") is False and not os.path.exists(d)



def test_doctor_counts_an_ipv6_loopback_resolver(tmp_path):
    from lark import hostcheck
    p = tmp_path / "resolv.conf"
    p.write_text("nameserver ::1\n")
    f = hostcheck.resolver(Config(resolv_conf=str(p)), which=lambda name: None)
    assert not f.ok and f.found == "::1" and "dnsmasq-base" in f.fix
