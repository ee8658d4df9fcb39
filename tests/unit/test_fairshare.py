"""Fair shares for unreserved jobs: the arithmetic, which jobs count, and the order limits move in."""
from types import SimpleNamespace

import pytest
from hypothesis import given, strategies as st

from lark.config import Config
from lark.errors import LarkError
from lark.kernel import fairshare
from lark.kernel.fairshare import FairShare, LinkJob, link_jobs, share_mbit, shares
from lark.plan import NetworkPlan
from lark.policy.classads import parse_ad
from lark.policy.engine import decide


def plan(machine: str, **cfg) -> NetworkPlan:
    return decide(parse_ad("ClusterId = 3\nProcId = 1", "job"), parse_ad(machine, "machine"),
                  Config(**cfg).validate(), "slot1_1", "slot1_1")


def test_fair_is_the_default_and_reads_the_machine_capacity():
    p = plan("Bandwidth = 0\nTotalBandwidth = 1000")
    assert p.rate_limit_mbit is None and p.fair_share_capacity_mbit == 1000
    assert "fair" in p.decided_by["rate_limit_mbit"]
    assert plan("DetectedBandwidth = 400").fair_share_capacity_mbit == 400
    assert plan("", bandwidth_mbit=250).fair_share_capacity_mbit == 250


def test_without_an_inventory_the_configured_capacity_comes_before_the_link_speed():
    """Issue 23 item 13: a slot with no Bandwidth inventory (a virtual NIC) still shares the link."""
    knob = decide(parse_ad("ClusterId = 3\nProcId = 1", "job"), parse_ad("Bandwidth = 0", "machine"),
                  Config(bandwidth_mbit=250).validate(), "slot1_1", "slot1_1", uplink_mbit=10_000)
    assert knob.fair_share_capacity_mbit == 250 and "bandwidth_mbit = 250" in knob.decided_by["rate_limit_mbit"]
    speed = decide(parse_ad("ClusterId = 3\nProcId = 1", "job"), parse_ad("Bandwidth = 0", "machine"),
                   Config(uplink="ens3").validate(), "slot1_1", "slot1_1", uplink_mbit=10_000)
    assert speed.rate_limit_mbit is None and speed.fair_share_capacity_mbit == 10_000
    assert "uplink ens3's link speed" in speed.decided_by["rate_limit_mbit"]
    # The slot's inventory, where there is one, is the figure reservations were made against.
    assert decide(parse_ad("ClusterId = 3\nProcId = 1", "job"), parse_ad("TotalBandwidth = 400", "machine"),
                  Config(bandwidth_mbit=250).validate(), "slot1_1", "slot1_1",
                  uplink_mbit=10_000).fair_share_capacity_mbit == 400


def test_without_any_capacity_an_unreserved_job_is_refused_not_run_unlimited():
    with pytest.raises(LarkError, match="no capacity is known") as e:
        plan("Bandwidth = 0")
    assert e.value.job == "3.1" and "LARK_BANDWIDTH_MBIT" in e.value.fix and "unlimited" in e.value.fix
    # Unlimited only when the admin says so.
    p = plan("Bandwidth = 0", default_bandwidth="unlimited")
    assert p.rate_limit_mbit is None and p.fair_share_capacity_mbit is None
    assert "default_bandwidth = unlimited" in p.decided_by["rate_limit_mbit"]
    # A job with no network needs no capacity.
    none = decide(parse_ad("ClusterId = 3\nProcId = 1\nInboundConnectivity = false\nOutboundConnectivity = false",
                           "job"), parse_ad("", "machine"), Config().validate(), "slot1_1", "slot1_1")
    assert none.network_type == "none"


def test_reserved_jobs_keep_their_allocation():
    p = plan("Bandwidth = 300\nTotalBandwidth = 1000")
    assert p.rate_limit_mbit == 300 and p.fair_share_capacity_mbit is None


def test_floor_must_be_positive():
    for bad in (0, -1, "lots"):
        with pytest.raises(LarkError, match="fair_share_floor_mbit"):
            Config(fair_share_floor_mbit=bad).validate()


def job(key, reserved=None, capacity=None, current=None):
    return LinkJob(key, key, reserved, capacity, current, f"h-{key}", "eth0", f"/run/netns/{key}")


def test_share_is_what_reservations_leave_split_evenly():
    assert share_mbit(400, [300], 3, 1) == pytest.approx(100 / 3)
    assert shares([job("r", 300), job("a", capacity=400), job("b", capacity=400)], 1) == {"a": 50, "b": 50}
    assert shares([job("r", 300)], 1) == {}
    # Reservations that fill the link leave each unreserved job the floor only.
    assert shares([job("r", 400), job("a", capacity=400)], 2) == {"a": 2}


@given(st.floats(10, 1e5), st.lists(st.floats(0.1, 1e4), max_size=8), st.integers(1, 64))
def test_limits_never_sum_above_the_link_while_reservations_leave_the_floor(capacity, reserved, n):
    floor = 0.01
    if sum(reserved) + n * floor > capacity:
        return
    assert sum(reserved) + n * share_mbit(capacity, reserved, n, floor) <= capacity * (1 + 1e-9)


def test_rebalance_lowers_before_it_raises_and_goes_on_past_a_failure(monkeypatch):
    calls = []

    def change(ipr, j, mbit):
        calls.append((j.key, mbit))
        if j.key == "gone":
            raise LarkError("its host-side device is gone", obj=j.host_if)

    monkeypatch.setattr(FairShare, "_change", staticmethod(change))
    running = [job("up", capacity=100, current=10), job("gone", capacity=100, current=40),
               job("down", capacity=100, current=90), job("same", capacity=100, current=20),
               job("new", capacity=100, current=None)]
    changed = FairShare(1).rebalance(None, running, skip="new")
    assert calls == [("down", 20), ("gone", 20), ("up", 20)]
    assert changed == {"down": 20, "up": 20}


def test_link_jobs_counts_reservations_at_once_and_fair_jobs_once_shaped():
    def rec(key, phase="ready", shaped=True, **plan):
        return SimpleNamespace(key=key, job_id=key, phase=phase, shaped=shaped, host_if=f"h-{key}",
                               plan={"network_type": "nat", **plan}, rate_limit_mbit=plan.get("rate_limit_mbit"))
    records = [rec("r", rate_limit_mbit=300, shaped=False), rec("f", rate_limit_mbit=50, fair_share_capacity_mbit=400),
               rec("early", fair_share_capacity_mbit=400, shaped=False), rec("leaving", "tearing-down",
                                                                          rate_limit_mbit=10),
               rec("none", network_type="none"), rec("new", fair_share_capacity_mbit=400, shaped=False)]
    new = NetworkPlan(job_id="new", slot="s", key="new", fair_share_capacity_mbit=400)
    got = link_jobs(records, new, lambda k: "eth0", lambda k: f"/ns/{k}")
    assert [(j.key, j.reserved_mbit, j.capacity_mbit, j.current_mbit) for j in got] == [
        ("r", 300, None, 300), ("f", None, 400, 50), ("new", None, 400, None)]
    assert fairshare.shares(got, 1) == {"f": 50, "new": 50}
