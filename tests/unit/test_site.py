"""Issue 17: pure logic of the site adaptations (resolver parsing, DNS steering rules, config checks)."""
import json
import os

import pytest

from lark.config import Config
from lark.errors import LarkError
from lark.kernel import dns
from lark.kernel.sections import DnsSection


def _dns(**kw) -> DnsSection:
    return DnsSection.from_config(Config(**kw))


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
    assert dns.Forwarder(_dns(resolv_conf=str(p), run_dir=str(tmp_path))).wanted == ["127.0.0.53"]
    assert dns.Forwarder(_dns(resolv_conf=str(p), run_dir=str(tmp_path), dns_forward=False)).wanted == []
    assert "dns_forward = false" in dns.forwarder_status(_dns(resolv_conf=str(p), dns_forward=False))


def test_job_ruleset_steers_only_port_53_of_the_loopback_resolvers():
    rules = dns.job_ruleset(["127.0.0.53", "127.0.0.1"], "169.254.53.53")
    assert "ip daddr { 127.0.0.53, 127.0.0.1 } meta l4proto { udp, tcp } th dport 53 dnat to 169.254.53.53" in rules
    assert 'iif != "lo" ip daddr 127.0.0.0/8 drop' in rules  # route_localnet must not open the job's loopback


def test_running_pid_ignores_a_pid_file_of_another_process(tmp_path):
    fwd = dns.Forwarder(_dns(run_dir=str(tmp_path)))
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


# -- lark doctor: the platform (lark/hostcheck.py), with fake command runners --------------------------------
from lark import hostcheck  # noqa: E402


def fake_runner(answers: dict):
    """argv[0] -> (rc, stdout); anything else is 'not installed'."""
    def run(argv):
        return answers.get(argv[0], (127, ""))
    return run


@pytest.mark.parametrize("out, ok, found", [
    ("$CondorVersion: 25.14.1 2025-10-01 BuildID: Debian-25.14.1 $\n", True, "25.14.1"),
    ("$CondorVersion: 24.7.3 2024-06-01 $\n", True, "24.7.3"),
    ("$CondorVersion: 24.0.12 2025-01-01 $\n", False, "24.0.12"),
    ("$CondorVersion: 23.10.1 2024-01-01 $\n", False, "23.10.1"),
])
def test_htcondor_version_needs_no_job_networking(out, ok, found):
    f = hostcheck.htcondor(fake_runner({"condor_version": (0, out)}))
    assert (f.ok, f.found) == (ok, found)
    assert ok or "24.7.3" in f.fix


def test_htcondor_missing_is_reported_with_the_fix():
    f = hostcheck.htcondor(fake_runner({}))
    assert not f.ok and f.found == "not found" and "install HTCondor" in f.fix


def test_python_version():
    assert hostcheck.python((3, 11, 2)).ok
    old = hostcheck.python((3, 9, 18))
    assert not old.ok and "python3.11" in old.fix


def test_firewalld_running_is_reported_with_zone_fix():
    cfg = Config(bridge_range="192.0.2.100-192.0.2.199", bridge_gateway="192.0.2.1")
    fs = hostcheck.firewalls(fake_runner({"firewall-cmd": (0, "running\n")}), cfg)
    assert [f.found for f in fs] == ["firewalld running"]
    assert not fs[0].ok and f"--add-source={cfg.subnet}" in fs[0].fix


def test_forward_drop_policy_in_another_nft_table_is_found_and_larks_own_is_not():
    chains = {"nftables": [
        {"metainfo": {"version": "1.0.6"}},
        {"chain": {"family": "inet", "table": "filter", "name": "forward", "hook": "forward", "policy": "drop"}},
        {"chain": {"family": "inet", "table": "filter", "name": "input", "hook": "input", "policy": "drop"}},
        {"chain": {"family": "inet", "table": "lark", "name": "fwd", "hook": "forward", "policy": "drop"}},
        {"chain": {"family": "ip", "table": "nat", "name": "post", "hook": "postrouting", "policy": "accept"}},
    ]}
    fs = hostcheck.firewalls(fake_runner({"nft": (0, json.dumps(chains))}), Config())
    assert len(fs) == 1 and not fs[0].ok
    assert "inet filter forward" in fs[0].found and 'iifname "lk-*" accept' in fs[0].fix


def test_iptables_legacy_forward_drop_and_harmless_legacy_rules():
    drop = "*filter\n:INPUT ACCEPT [0:0]\n:FORWARD DROP [0:0]\n:OUTPUT ACCEPT [0:0]\n-A INPUT -p tcp -j ACCEPT\nCOMMIT\n"
    fs = hostcheck.firewalls(fake_runner({"iptables-legacy-save": (0, drop)}), Config())
    assert len(fs) == 1 and not fs[0].ok and "lk-+" in fs[0].fix
    harmless = drop.replace(":FORWARD DROP", ":FORWARD ACCEPT")
    fs = hostcheck.firewalls(fake_runner({"iptables-legacy-save": (0, harmless)}), Config())
    assert len(fs) == 1 and fs[0].ok and "1 rules" in fs[0].found


def test_nothing_else_in_charge():
    fs = hostcheck.firewalls(fake_runner({"firewall-cmd": (252, "not running\n"), "nft": (0, '{"nftables": []}'),
                                          "iptables-legacy-save": (0, "")}), Config())
    assert [(f.ok, f.found) for f in fs] == [(True, "only Lark's (nftables)")]


def test_resolver_finding_and_report_counts_what_needs_the_admin(tmp_path):
    p = tmp_path / "resolv.conf"
    p.write_text("nameserver 127.0.0.53\n")
    good = hostcheck.resolver(Config(resolv_conf=str(p)))
    bad = hostcheck.resolver(Config(resolv_conf=str(p), dns_forward=False))
    assert good.ok and "169.254.53.53" in good.action
    assert not bad.ok and "dns_forward = true" in bad.fix
    text, n = hostcheck.report([good, bad, hostcheck.python((3, 9, 0))])
    assert n == 2 and sum(line.strip().startswith("fix:") for line in text.splitlines()) == 2





@pytest.mark.parametrize("kw, key", [(dict(bridge_ipv6="dhcp"), "bridge_ipv6"), (dict(slaac_timeout=0), "slaac_timeout")])
def test_bad_ipv6_autoconf_config_is_refused(kw, key):
    with pytest.raises(LarkError) as e:
        Config(**kw).validate()
    assert key in str(e.value)


def test_resolver_finding_without_dnsmasq_names_the_package(tmp_path):
    p = tmp_path / "resolv.conf"
    p.write_text("nameserver 127.0.0.53\n")
    f = hostcheck.resolver(Config(resolv_conf=str(p)), which=lambda name: None)
    assert not f.ok and "dnsmasq-base" in f.fix
    assert hostcheck.resolver(Config(resolv_conf=str(p)), which=lambda name: "/usr/sbin/" + name).ok


def test_setup_job_without_a_forwarder_logs_and_leaves_the_job_unsteered(tmp_path, monkeypatch, caplog):
    p = tmp_path / "resolv.conf"
    p.write_text("nameserver 127.0.0.53\n")
    fwd = dns.Forwarder(_dns(resolv_conf=str(p), run_dir=str(tmp_path)))

    def no_dnsmasq(ipr):
        raise LarkError("dnsmasq is not installed", obj="DNS forwarder (dnsmasq)")
    monkeypatch.setattr(fwd, "ensure", no_dnsmasq)
    steered = []
    monkeypatch.setattr(dns, "steer_job", lambda *a: steered.append(a))
    assert dns.setup_job(fwd, None, None, "10.213.0.2", -1, "/x", "eth0", 2, "7.0") == []
    assert steered == [] and "job 7.0" in caplog.text and "dnsmasq is not installed" in caplog.text


def test_setup_job_for_a_bridged_job_without_host_address_on_the_bridge(tmp_path, monkeypatch):
    p = tmp_path / "resolv.conf"
    p.write_text("nameserver 127.0.0.53\n")
    fwd = dns.Forwarder(_dns(resolv_conf=str(p), run_dir=str(tmp_path)))
    monkeypatch.setattr(fwd, "ensure", lambda ipr: None)
    monkeypatch.setattr(dns, "host_address_on", lambda ipr, dev: None)
    steered = []
    monkeypatch.setattr(dns, "steer_job", lambda *a: steered.append(a))
    assert dns.setup_job(fwd, None, "lkbr0", "192.0.2.100", -1, "/x", "eth0", 2, "8.0") == []
    monkeypatch.setattr(dns, "host_address_on", lambda ipr, dev: "192.0.2.2")
    assert dns.setup_job(fwd, None, "lkbr0", "192.0.2.100", -1, "/x", "eth0", 2, "8.0") == ["127.0.0.53"]
    assert steered[0][5] == "192.0.2.2"  # the route to the forwarder goes via the host's bridge address


def test_ptrace_scope_finding(tmp_path):
    from lark.hostcheck import ptrace_scope
    f = tmp_path / "ptrace_scope"
    assert not ptrace_scope(str(tmp_path / "absent")).ok
    assert "USE_PID_NAMESPACES" in ptrace_scope(str(tmp_path / "absent")).fix
    f.write_text("0\n")
    zero = ptrace_scope(str(f))
    assert not zero.ok and "kernel.yama.ptrace_scope=1" in zero.fix
    f.write_text("1\n")
    assert ptrace_scope(str(f)).ok and ptrace_scope(str(f)).fix == ""


def config_runner(params: dict):
    """condor_config_val NAME -> the value, or exit 1 when the knob is not defined (as the real tool does)."""
    def run(argv):
        if argv[0] != "condor_config_val":
            return 127, ""
        value = params.get(argv[1])
        return (0, value + "\n") if value is not None else (1, "")
    return run


def test_a_job_exit_hook_under_either_keyword_is_reported_with_the_knob_to_remove():
    assert hostcheck.job_exit_hook(config_runner({"STARTER_JOB_HOOK_KEYWORD": "LARK",
                                                  "LARK_HOOK_PREPARE_JOB": "/opt/lark/bin/lark-prepare-job"})).ok
    f = hostcheck.job_exit_hook(config_runner({"STARTER_JOB_HOOK_KEYWORD": "LARK",
                                               "LARK_HOOK_JOB_EXIT": "/opt/lark/bin/lark-hook"}))
    assert not f.ok and "output transfer" in f.action and f.fix.startswith("remove LARK_HOOK_JOB_EXIT")
    f = hostcheck.job_exit_hook(config_runner({"STARTER_DEFAULT_JOB_HOOK_KEYWORD": "SITE",
                                               "SITE_HOOK_JOB_EXIT": "/usr/local/bin/site-exit"}))
    assert not f.ok and "SITE_HOOK_JOB_EXIT = /usr/local/bin/site-exit" in f.found
    assert hostcheck.job_exit_hook(fake_runner({})).ok  # no HTCondor configuration at all: no hook


def test_transfer_gap_is_named_and_url_transfers_off_closes_the_part_lark_can_close():
    on = hostcheck.file_transfer(config_runner({}))
    assert not on.ok and "URL transfers" in on.found and "ENABLE_URL_TRANSFERS = False" in on.fix
    off = hostcheck.file_transfer(config_runner({"ENABLE_URL_TRANSFERS": "False"}))
    assert off.ok and "URL" not in off.found and "sandbox transfer" in off.found and not off.fix


def test_url_transfers_by_larks_wrapped_plugins_are_no_gap_and_an_unwrapped_one_is_named():
    shipped = {"LARK_LIBEXEC": "/opt/lark/libexec",
               "FILETRANSFER_PLUGINS": "/opt/lark/libexec/transfer/curl_plugin, /usr/libexec/condor/data_plugin"}
    f = hostcheck.file_transfer(config_runner(shipped))
    assert f.ok and "URL" not in f.found and "sandbox transfer" in f.found
    site = dict(shipped, FILETRANSFER_PLUGINS=shipped["FILETRANSFER_PLUGINS"] + ", /usr/libexec/condor/stash_plugin")
    f = hostcheck.file_transfer(config_runner(site))
    assert not f.ok and "/usr/libexec/condor/stash_plugin" in f.found and "lark install-hook" in f.fix


def test_no_network_namespaces_allowed_is_reported_by_doctor_and_refused_by_the_check(tmp_path):
    """Issue 23 item 5: `user.max_net_namespaces = 0` (OSG/EGI hardening) stops root too: no job can start."""
    from lark.kernel.netns import net_namespaces_forbidden
    limit = tmp_path / "max_net_namespaces"
    limit.write_text("0\n")
    f = hostcheck.net_namespaces(str(limit))
    assert not f.ok and "no job can start" in f.action and "max_user_namespaces = 0 instead" in f.fix
    refusal = net_namespaces_forbidden(str(limit))
    assert refusal is not None and "user.max_net_namespaces = 0" in str(refusal)
    limit.write_text("96365\n")
    assert hostcheck.net_namespaces(str(limit)).ok and net_namespaces_forbidden(str(limit)) is None
    assert net_namespaces_forbidden(str(tmp_path / "absent")) is None  # unknown: nothing to refuse
