import os

import pytest

from lark import doctor


def test_report_counts_missing_required_features_and_the_chosen_firewall():
    everything = {name: True for name, _, _ in doctor.FEATURES}
    text, missing = doctor.report(everything, "nftables")
    assert missing == 0 and "MISSING" not in text
    _, missing = doctor.report({**everything, "iptables": False}, "nftables")
    assert missing == 0  # the backend not chosen is optional
    text, missing = doctor.report({**everything, "iptables": False, "veth": False}, "iptables")
    assert missing == 2
    assert "iptables               MISSING   required" in text
    assert doctor.report({**everything, "openvswitch_kernel": False}, "nftables")[0].endswith(
        "OVS datapath: userspace (netdev)")


# -- issue 23 items 13 and 14: the fair share's capacity and process identity, with fake probes ----------------
from lark import hostcheck  # noqa: E402
from lark.config import Config  # noqa: E402
from lark.daemon import peercred  # noqa: E402


def test_doctor_warns_when_the_fair_share_has_no_capacity():
    cfg = Config(uplink="ens3").validate()
    none = hostcheck.bandwidth_capacity(cfg, lambda ifname: None)   # a virtual NIC: no speed reported
    assert not none.ok and "ens3 reports no speed" in none.found
    assert "LARK_BANDWIDTH_MBIT" in none.fix and "LARK_DEFAULT_BANDWIDTH = unlimited" in none.fix
    text, to_fix = hostcheck.report([none])
    assert to_fix == 1 and "bandwidth  ACTION" in text
    speed = hostcheck.bandwidth_capacity(cfg, lambda ifname: 25_000 if ifname == "ens3" else None)
    assert speed.ok and speed.found == "uplink ens3 at 25000 Mbit/s"
    knob = hostcheck.bandwidth_capacity(Config(uplink="ens3", bandwidth_mbit=800).validate(), lambda ifname: None)
    assert knob.ok and knob.found == "bandwidth_mbit = 800"
    explicit = hostcheck.bandwidth_capacity(Config(default_bandwidth="unlimited").validate(), lambda ifname: None)
    assert explicit.ok and "unlimited" in explicit.action


def test_doctor_reports_whether_the_kernel_has_so_peerpidfd_and_the_fallback(monkeypatch):
    have = hostcheck.process_identity(lambda: "", kernel="6.8.0")
    assert have.ok and have.found == "SO_PEERPIDFD available (kernel 6.8.0)"
    # A kernel without SO_PEERPIDFD (EL8/EL9): getsockopt fails, and the start-time fallback is named.
    monkeypatch.setattr(peercred, "peer_pidfd", lambda sock: None)
    old = hostcheck.process_identity(kernel="5.14.0-427.el9")
    assert old.found == "no SO_PEERPIDFD (kernel 5.14.0-427.el9; it needs Linux 6.5)"
    assert "fallback: process start time" in old.action


def test_so_peerpidfd_probe_on_this_kernel():
    release = tuple(int(x) for x in os.uname().release.split(".")[:2])
    if release < (6, 5):
        pytest.skip("SO_PEERPIDFD is in Linux 6.5 (older distribution kernels may have it backported)")
    assert peercred.identity_fallback() == ""


def test_doctor_lists_both_findings():
    whats = [f.what for f in hostcheck.check(Config().validate(), lambda argv: (127, ""))]
    assert "bandwidth" in whats and "identity" in whats
