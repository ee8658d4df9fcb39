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
