"""Paper Table I/II examples through the real ClassAd engine (classad2)."""
import pytest

from lark.policy.classads import parse_ad
from lark.config import Config
from lark.errors import LarkError
from lark.policy.engine import decide

PAPER_NETWORK_TYPE = ('NetworkType = ifThenElse(TARGET.OutboundConnectivity, '
                      'ifThenElse(TARGET.InboundConnectivity, "bridge", "NAT"), "null")')


def plan(job, machine=""):
    # bandwidth_mbit: a link capacity for the fair share of jobs without a reservation (else they are refused)
    return decide(parse_ad(job, "job"), parse_ad(machine, "machine"), Config(bandwidth_mbit=1000), "slot1", "slot1")


def test_defaults_give_nat_with_outbound_only():
    p = plan("ClusterId = 4\nProcId = 2\nOwner = \"alice\"\nAcctGroup = \"cms\"")
    assert (p.network_type, p.inbound, p.outbound, p.accounting) == ("nat", False, True, True)
    assert (p.job_id, p.owner, p.accounting_group) == ("4.2", "alice", "cms")
    assert p.decided_by["network_type"].startswith("default")


@pytest.mark.parametrize("inbound,outbound,expected", [
    ("true", "true", "bridge"), ("false", "true", "nat"), ("true", "false", "none"), ("false", "false", "none"),
])
def test_paper_network_type_expression(inbound, outbound, expected):
    p = plan(f"InboundConnectivity = {inbound}\nOutboundConnectivity = {outbound}", PAPER_NETWORK_TYPE)
    assert p.network_type == expected
    assert "NetworkType" in p.decided_by["network_type"] or expected == "none"


def test_both_connectivities_false_disable_network_whatever_the_machine_says():
    p = plan("InboundConnectivity = false\nOutboundConnectivity = false", 'NetworkType = "nat"')
    assert p.network_type == "none"


def test_bad_values_name_attribute_expression_and_value():
    with pytest.raises(LarkError) as e:
        plan("InboundConnectivity = \"yes\"")
    assert "InboundConnectivity" in str(e.value) and "'yes'" in str(e.value)
    with pytest.raises(LarkError) as e:
        plan("", 'NetworkType = strcat("br", "idge0")')
    assert "NetworkType" in str(e.value) and "bridge0" in str(e.value)
    with pytest.raises(LarkError, match="ERROR"):
        plan("", "NetworkType = 1 + \"a\"")


def test_interface_and_vlan_names_are_validated():
    with pytest.raises(LarkError, match="interface name"):
        plan("", 'BridgeInterface = "br0; reboot"')
    with pytest.raises(LarkError, match="VLAN"):
        plan('RequestedVLAN = "$(reboot)"')
    with pytest.raises(LarkError, match="callout"):
        plan('RequestedVLAN = "physics"', 'VLAN = "physics"')
    assert plan("RequestedVLAN = 42", "VLAN = 42").vlan == 42


def test_requested_vlan_mismatch_is_an_error():
    with pytest.raises(LarkError, match="RequestedVLAN"):
        plan('RequestedVLAN = "physics"', 'VLAN = "chemistry"')


def test_ip_protocol_matching():
    assert plan('IPProtocol = "IPv4"').ip_protocol == "IPv4"
    assert plan('IPProtocol = "IPv4+IPv6"', 'IPProtocol = "IPv4,IPv6"').ip_protocol == "IPv4+IPv6"
    with pytest.raises(LarkError, match="offers IPv4"):
        plan('IPProtocol = "IPv6"')


def test_accounting_needs_job_and_machine():
    assert plan("NetworkAccounting = false").accounting is False
    assert plan("", "NetworkAccounting = false").accounting is False
    assert plan("NetworkAccounting = true").accounting is True


def test_bandwidth_request_validated():
    assert plan("RequestBandwidth = 300").request_bandwidth_mbit == 300
    with pytest.raises(LarkError, match="RequestBandwidth"):
        plan("RequestBandwidth = -5")
    with pytest.raises(LarkError, match="RequestBandwidth"):
        plan('RequestBandwidth = "lots"')


def test_malformed_ads_are_clear_errors():
    for bad in ("A = = 1", "[a=]", "x" * 20, "Inbound = (", "a=1\nb="):
        with pytest.raises(LarkError, match="job"):
            parse_ad(bad, "job")
    assert len(parse_ad("[]", "job")) == 0
    assert parse_ad("A = 1\n\nB = 2", "condor_q -l").get("A") == 1
