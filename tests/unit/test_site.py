"""Issue 17: pure logic of the site adaptations (resolver parsing, DNS steering rules, config checks)."""
import os

import pytest

from lark.config import Config
from lark.errors import LarkError
from lark.kernel import dns


def test_loopback_nameservers_are_found_and_others_left_alone(tmp_path):
    p = tmp_path / "resolv.conf"
    p.write_text("# systemd-resolved\nnameserver 127.0.0.53\nnameserver 10.0.0.2\nnameserver ::1\n"
                 "nameserver 127.0.0.1 # nscd\nnameserver 127.0.0.53\nsearch example.org\noptions edns0\n"
                 "nameserver not-an-address\n")
    assert dns.loopback_nameservers(str(p)) == ["127.0.0.53", "127.0.0.1"]


def test_no_loopback_nameserver_or_no_file_means_nothing_to_steer(tmp_path):
    p = tmp_path / "resolv.conf"
    p.write_text("nameserver 192.0.2.53\n")
    assert dns.loopback_nameservers(str(p)) == []
    assert dns.loopback_nameservers(str(tmp_path / "missing")) == []


def test_forwarder_is_wanted_only_with_loopback_resolvers_and_forwarding_on(tmp_path):
    p = tmp_path / "resolv.conf"
    p.write_text("nameserver 127.0.0.53\n")
    assert dns.Forwarder(Config(resolv_conf=str(p), run_dir=str(tmp_path))).wanted == ["127.0.0.53"]
    assert dns.Forwarder(Config(resolv_conf=str(p), run_dir=str(tmp_path), dns_forward=False)).wanted == []
    assert "dns_forward = false" in dns.forwarder_status(Config(resolv_conf=str(p), dns_forward=False))


def test_job_ruleset_steers_only_port_53_of_the_loopback_resolvers():
    rules = dns.job_ruleset(["127.0.0.53", "127.0.0.1"], "169.254.53.53")
    assert "ip daddr { 127.0.0.53, 127.0.0.1 } meta l4proto { udp, tcp } th dport 53 dnat to 169.254.53.53" in rules
    assert 'iif != "lo" ip daddr 127.0.0.0/8 drop' in rules  # route_localnet must not open the job's loopback


def test_running_pid_ignores_a_pid_file_of_another_process(tmp_path):
    fwd = dns.Forwarder(Config(run_dir=str(tmp_path)))
    assert fwd.running_pid() is None
    (tmp_path / "dns-forwarder.pid").write_text(f"{os.getpid()}\n")  # pytest, not our dnsmasq
    assert fwd.running_pid() is None


@pytest.mark.parametrize("kw, key", [
    (dict(dns_address="127.0.0.53"), "dns_address"),
    (dict(dns_address="10.213.0.9"), "dns_address"),
    (dict(dns_address="nope"), "dns_address"),
    (dict(resolv_conf="resolv.conf"), "resolv_conf"),
    (dict(job_mtu=100), "job_mtu"),
])
def test_bad_site_config_is_refused_with_the_key(kw, key):
    with pytest.raises(LarkError) as e:
        Config(**kw).validate()
    assert key in str(e.value)
