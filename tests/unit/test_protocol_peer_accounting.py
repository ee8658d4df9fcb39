import os

import pytest
from helpers.proctree import starter_with_job

from lark import protocol
from lark.kernel.accounting import JobUsage
from lark.errors import LarkError
from lark.kernel.firewall.base import Counters
from lark.daemon.peercred import find_starter, slot_from_cmdline, start_time


def test_request_roundtrip():
    assert protocol.parse_request(protocol.request("setup")) == {"lark": 1, "op": "setup"}


@pytest.mark.parametrize("line,needle", [
    (b"garbage", "not JSON"), (b"[1,2]", "not a JSON object"), (b'{"lark": 2, "op": "ping"}', "version"),
    (b'{"op": "ping"}', "version"), (b'{"lark": 1, "op": "shutdown"}', "unknown operation"),
    (b"\xff\xfe", "not JSON"),
])
def test_bad_requests(line, needle):
    with pytest.raises(LarkError, match=needle):
        protocol.parse_request(line)


def test_slot_from_starter_cmdline():
    assert slot_from_cmdline(["condor_starter", "-f", "-local-name", "slot_type_1", "-a", "slot1_3",
                              "<127.0.0.1:9618>"]) == "slot1_3"
    assert slot_from_cmdline(["condor_starter", "-f"]) is None
    assert slot_from_cmdline(["condor_starter", "-a"]) is None


def test_find_starter_walks_to_root_owned_ancestor(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("the starter must be root-owned")
    # A real process tree: a "starter" (a copy of sh, so /proc/PID/exe names it) whose child is the "job".
    with starter_with_job(tmp_path, "slot1_3") as (starter_pid, job_pid, fake_starter):
        got = find_starter(job_pid, [fake_starter])
        assert got is not None and got.pid == starter_pid and got.slot == "slot1_3"
        assert got.start == start_time(starter_pid) > 0
        assert find_starter(job_pid, ["/usr/sbin/condor_starter"]) is None  # another binary is no starter
        assert find_starter(starter_pid, [fake_starter]) is None  # the starter itself is not its own job


def test_usage_totals_rates_and_peaks():
    u = JobUsage(started=100.0)
    u.update(Counters(bytes_in=1_000_000, bytes_out=0, packets_in=10), 101.0)
    u.update(Counters(bytes_in=1_500_000, bytes_out=250_000, packets_in=15, packets_out=5), 102.0)
    s = u.summary()
    assert s["bytes_in"] == 1_500_000 and s["bytes_out"] == 250_000
    assert s["avg_in_bps"] == pytest.approx(1_500_000 * 8 / 2)
    assert s["peak_in_bps"] == pytest.approx(8_000_000)
    assert s["peak_out_bps"] == pytest.approx(2_000_000)
    assert JobUsage(started=5.0).summary()["avg_in_bps"] == 0.0
