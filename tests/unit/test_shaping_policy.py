"""Bandwidth limits: which figure becomes the limit, and how the bucket is sized."""
import pytest
from hypothesis import given, strategies as st

from lark.policy.classads import parse_ad
from lark.config import Config, from_mapping
from lark.errors import LarkError
from lark.policy.engine import decide
from lark.kernel.shaping import GSO_MAX, burst_for, limit_for


def plan(job="", machine="", **cfg):
    return decide(parse_ad("ClusterId = 3\nProcId = 1\n" + job, "job"), parse_ad(machine, "machine"),
                  Config(**cfg).validate(), "slot1_1",
                  "slot1_1")


def test_limit_is_the_slots_allocation_not_the_jobs_request():
    p = plan("RequestBandwidth = 5000", "Bandwidth = 300")
    assert p.rate_limit_mbit == 300
    assert p.request_bandwidth_mbit == 5000
    assert "allocated Bandwidth" in p.decided_by["rate_limit_mbit"]


def test_no_allocation_follows_the_default_policy():
    assert plan(machine="Bandwidth = 0", bandwidth_mbit=1000).rate_limit_mbit is None  # fair: set at start
    assert plan(machine="Bandwidth = 0", default_bandwidth="80").rate_limit_mbit == 80
    share = plan(machine="TotalBandwidth = 10000\nCpus = 4\nTotalCpus = 16", default_bandwidth="share")
    assert share.rate_limit_mbit == 2500
    assert "share" in share.decided_by["rate_limit_mbit"]


def test_share_without_machine_figures_is_a_clear_error():
    with pytest.raises(LarkError, match="TotalBandwidth.*MACHINE_RESOURCE_INVENTORY_Bandwidth"):
        plan(machine="Cpus = 1", default_bandwidth="share")


def test_no_network_means_no_limit():
    p = plan("OutboundConnectivity = false\nInboundConnectivity = false", "Bandwidth = 100")
    assert p.network_type == "none" and p.rate_limit_mbit is None


def test_bad_allocation_is_rejected():
    with pytest.raises(LarkError, match="Bandwidth"):
        plan(machine='Bandwidth = "lots"')


@pytest.mark.parametrize("value", ["fast", "-5", "0", "1e12"])
def test_default_bandwidth_config_is_validated(value):
    with pytest.raises(LarkError, match="default_bandwidth"):
        from_mapping({"network": {"default_bandwidth": value}})


@given(st.integers(min_value=1, max_value=10**13))
def test_burst_never_below_two_gso_packets_and_grows_with_rate(rate):
    b = burst_for(rate)
    assert b >= 2 * GSO_MAX
    assert burst_for(rate * 2) >= b


def test_burst_is_five_ms_at_high_rates():
    assert burst_for(10_000_000_000) == 10_000_000_000 // 8 // 200
    assert limit_for(40_000).rate_bit == 40_000_000_000  # above 2^32 bytes/s: the 64-bit fields carry it


@pytest.mark.parametrize("mbit", [0, -1, float("nan"), 1e8])
def test_limit_out_of_range(mbit):
    with pytest.raises(LarkError, match="out of range"):
        limit_for(mbit, "3.1")
