"""Issue 17.3, DHCPv6: config checks, the pre-address filters, the client's command line, finding (and not
finding) its process, and teardown order and error handling against the in-memory kernel."""
import json
import os

import pytest

from helpers.fakekernel import fake_networker
from lark.config import Config
from lark.errors import LarkError
from lark.kernel import dhcp6
from lark.kernel.attach.ovs import auto6_pre_address_flows
from lark.kernel.firewall import job_netns
from lark.kernel.firewall.nftables import NftablesFirewall
from lark.kernel.sections import Dhcp6Section, FirewallSection
from lark.plan import NetworkPlan

MAC = "02:39:c5:3f:3a:3a"


def test_dhcpv6_is_a_valid_choice_and_its_timeout_is_checked():
    assert Config(bridge_ipv6="dhcpv6").validate().dhcpv6_timeout == 10.0
    with pytest.raises(LarkError) as e:
        Config(bridge_ipv6="dhcpv6", dhcpv6_timeout=0).validate()
    assert "dhcpv6_timeout" in str(e.value) and "seconds" in str(e.value)
    with pytest.raises(LarkError) as e:
        Config(bridge_ipv6="dhcp6").validate()
    assert '"dhcpv6"' in str(e.value)


def test_ovs_pre_address_flows_let_out_only_what_each_method_needs():
    assert auto6_pre_address_flows("static", MAC) == []
    slaac = auto6_pre_address_flows("slaac", MAC)
    assert slaac == [f"priority=95,dl_src={MAC},vlan_tci=0,icmp6,ipv6_src=fe80::/10,icmp_type=133,actions=NORMAL"]
    dhcp = auto6_pre_address_flows("dhcpv6", MAC)
    assert dhcp[0] == slaac[0]
    assert dhcp[1] == f"priority=95,dl_src={MAC},vlan_tci=0,udp6,ipv6_src=fe80::/10,tp_src=546,tp_dst=547,actions=NORMAL"
    assert len(dhcp) == 2


def _pre_rules(cfg: Config) -> list[str]:
    return [json.dumps(r) for r in NftablesFirewall(FirewallSection.from_config(cfg))._rs_before_address()]


def test_bridge_pre_address_rules_add_dhcpv6_client_messages_only_for_dhcpv6():
    assert _pre_rules(Config()) == []
    slaac, dhcp = _pre_rules(Config(bridge_ipv6="slaac")), _pre_rules(Config(bridge_ipv6="dhcpv6"))
    assert len(slaac) == 1 and "nd-router-solicit" in slaac[0]
    assert dhcp[0] == slaac[0] and len(dhcp) == 2
    assert '"right": 546' in dhcp[1] and '"right": 547' in dhcp[1] and '"fe80::"' in dhcp[1] and '"accept"' in dhcp[1]


def test_inbound_filter_admits_dhcpv6_replies_only_with_the_client(monkeypatch):
    seen = []
    monkeypatch.setattr(job_netns.libnft, "run_in_netns", lambda fd, rules: seen.append(rules) or (0, "", ""))
    job_netns.secure(3, "1.0", block_inbound=True)
    job_netns.secure(3, "1.0", block_inbound=True, dhcpv6_client=True)
    assert "dport 546" not in seen[0]
    # Inside the input chain (before its closing brace), with the drop policy kept.
    chain = seen[1].split("chain input", 1)[1].rsplit("  }\n}", 1)[0]
    assert "udp sport 547 udp dport 546 accept" in chain and "policy drop" in chain


def test_client_runs_in_the_jobs_netns_with_its_own_directories(tmp_path):
    cfg = Dhcp6Section.from_config(Config(run_dir=str(tmp_path)))
    argv = dhcp6.client_argv(cfg, "slot1", "/run/netns/lark-slot1", "eth0", 10)
    assert argv[:5] == ["unshare", "--mount", "--propagation", "private", "--"]
    d = dhcp6.job_dir(cfg, "slot1")
    assert argv[argv.index("lark-dhcp6") + 1:argv.index("lark-dhcp6") + 3] == [d, "/run/netns/lark-slot1"]
    assert argv[-6:] == ["dhcpcd", f"--config={d}/dhcpcd.conf", "-6", "-w", "--timeout=10", "eth0"]
    assert "script /bin/true" in dhcp6.CONFIG and "duid ll" in dhcp6.CONFIG and "ia_na" in dhcp6.CONFIG


def test_a_pid_file_naming_another_process_is_not_our_client(tmp_path):
    cfg = Dhcp6Section.from_config(Config(run_dir=str(tmp_path)))
    assert dhcp6.running_pid(cfg, "slot1") is None
    assert dhcp6.stop(cfg, "slot1") is False            # nothing there: safe to repeat
    d = dhcp6._prepare_dir(cfg, "slot1", f"/proc/{os.getpid()}/ns/net")
    assert oct(os.stat(os.path.dirname(d)).st_mode & 0o777) == "0o700"
    with open(os.path.join(d, "run", "eth0-6.pid"), "w") as f:
        f.write(str(os.getpid()))                      # a reused pid: in the right netns, but not a dhcpcd
    assert dhcp6.running_pid(cfg, "slot1") is None
    assert dhcp6.stop(cfg, "slot1") is False and not os.path.exists(d)  # never signalled, directory removed


def test_missing_dhcpcd_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setattr(dhcp6.shutil, "which", lambda name: None)
    ns = tmp_path / "ns"
    ns.write_text("")
    with pytest.raises(LarkError) as e:
        dhcp6.acquire(Dhcp6Section.from_config(Config(run_dir=str(tmp_path))), "slot1", str(ns), "eth0", None, 2,
                      "7.0", 5)
    assert "job 7.0" in str(e.value) and "dhcpcd-base" in str(e.value)


def test_teardown_stops_the_client_before_the_netns_and_goes_on_past_its_failure(tmp_path, monkeypatch):
    net, k = fake_networker(str(tmp_path), monkeypatch)
    net.setup(NetworkPlan(job_id="7.0", slot="slot1", key="slot1"), os.getpid(), 1, os.getpid(), 99)
    k.fail.add("dhcp6.stop")
    with pytest.raises(LarkError) as e:
        net.teardown("slot1", "test")
    assert "could not stop the DHCPv6 client: injected failure" in str(e.value)
    assert k.calls.index("dhcp6.stop") < k.calls.index("netns.detach")
    assert k.of_key("slot1") == set()                  # everything else went
    assert net.records.load("slot1").phase == "tearing-down"  # kept, so gc retries


def test_doctor_names_the_package_when_dhcpv6_is_configured_without_dhcpcd():
    from lark import hostcheck
    assert hostcheck.dhcpv6_client(Config(), which=lambda name: None) == []
    missing = hostcheck.dhcpv6_client(Config(bridge_ipv6="dhcpv6"), which=lambda name: None)
    assert len(missing) == 1 and not missing[0].ok and "dhcpcd-base" in missing[0].fix
    found = hostcheck.dhcpv6_client(Config(bridge_ipv6="dhcpv6"), which=lambda name: "/usr/sbin/" + name)
    assert found[0].ok and found[0].found == "/usr/sbin/dhcpcd"


def test_gc_finds_and_stops_daemons_left_in_a_jobs_netns_after_its_name_is_gone(tmp_path, monkeypatch):
    from lark.daemon.sweep import sweep
    from lark.kernel import dns6
    # The real client and relay bookkeeping (directories under run_dir) under the fake kernel's orchestration.
    net, _ = fake_networker(str(tmp_path), ops=dict(dhcpv6_keys=dhcp6.job_keys, dhcpv6_stop=dhcp6.stop,
                                                    dns6_relay_keys=dns6.job_keys, stop_dns6_relay=dns6.stop_relay))
    os.makedirs(os.path.join(dhcp6.job_dir(net.sections.dhcp6, "slot9"), "run"))
    os.makedirs(dns6.relay_dir(net.sections.dns, net.netns_path("slot9")))
    os.makedirs(dhcp6.job_dir(net.sections.dhcp6, "slot8"))   # a running job's: kept
    assert sweep(net, keep={"slot8"}, others=[]) == ["slot9: DHCPv6 client, IPv6 DNS relay"]
    assert not os.path.exists(dhcp6.job_dir(net.sections.dhcp6, "slot9"))
    assert not os.path.exists(dns6.relay_dir(net.sections.dns, net.netns_path("slot9")))
    assert os.path.exists(dhcp6.job_dir(net.sections.dhcp6, "slot8"))
