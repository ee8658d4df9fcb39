"""The pure parts of bench/pool_true_jobs.py: log parsing, per-job arithmetic, percentiles, the summary line."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

_SPEC = importlib.util.spec_from_file_location(
    "pool_true_jobs", Path(__file__).resolve().parents[2] / "bench" / "pool_true_jobs.py")
bench = importlib.util.module_from_spec(_SPEC)
sys.modules[_SPEC.name] = bench  # dataclasses look their module up there
_SPEC.loader.exec_module(bench)

# Two starters of one slot, as HTCondor 25 writes them with STARTER_DEBUG = D_SUB_SECOND (no "(pid:N)").
STARTER_LOG = """\
11/23/26 22:59:16.100 ******************************************************
11/23/26 22:59:16.100 ** condor_starter (CONDOR_STARTER) STARTING UP
11/23/26 22:59:16.722 Starting a VANILLA universe job with ID: 131.0
11/23/26 22:59:16.800 Using wrapper /opt/lark/bin/lark-job-wrapper to exec /bin/true
11/23/26 22:59:16.829 Create_Process succeeded, pid=367106
11/23/26 22:59:17.476 Process exited, pid=367106, status=0
11/23/26 22:59:17.500 HOOK_JOB_EXIT (/opt/lark/bin/lark-hook) invoked with reason: "exit"
11/23/26 22:59:20.000 ******************************************************
11/23/26 22:59:20.000 ** condor_starter (CONDOR_STARTER) STARTING UP
11/23/26 22:59:20.100 Starting a VANILLA universe job with ID: 132.0
11/23/26 22:59:20.150 Create_Process succeeded, pid=367200
11/23/26 22:59:20.160 Process exited, pid=367200, status=0
"""

START_LOG = """\
11/23/26 22:59:16.000 slot1: Got activate_claim request from shadow (10.77.0.2)
11/23/26 22:59:16.510 slot1: Remote job ID is 131.0
11/23/26 22:59:16.600 slot2: Got activate_claim request from shadow (10.77.0.2)
11/23/26 22:59:16.610 slot2: Remote job ID is 999.0
11/23/26 22:59:18.000 Starter pid 367100 exited with status 0
11/23/26 22:59:18.000 slot1: State change: starter exited : ./src/condor_startd.V6/Resource.cpp(1112) Claimed/Cleaning
11/23/26 22:59:19.900 slot1: Got activate_claim request from shadow (10.77.0.2)
11/23/26 22:59:19.910 slot1: Remote job ID is 132.0
11/23/26 22:59:20.400 slot1: State change: starter exited : ./src/condor_startd.V6/Resource.cpp(1112) Claimed/Cleaning
"""


def test_log_time_reads_milliseconds_and_whole_seconds():
    assert bench.log_time("11/23/26 22:59:16.722 x") - bench.log_time("11/23/26 22:59:16 x") == pytest.approx(0.722)
    assert bench.log_time("no stamp here") is None


def test_starter_log_splits_starters_by_banner_and_keeps_wrapper_and_hooks():
    runs = bench.parse_starter_log(STARTER_LOG)
    assert set(runs) == {"131.0", "132.0"}
    lark, plain = runs["131.0"], runs["132.0"]
    assert lark.wrapper == "/opt/lark/bin/lark-job-wrapper" and lark.hooks == ["HOOK_JOB_EXIT"]
    assert lark.exited - lark.started == pytest.approx(0.647)
    assert plain.wrapper == "" and plain.hooks == []


def test_starter_log_with_pid_prefix():
    text = STARTER_LOG.replace("11/23/26 22:59:17.476 ", "11/23/26 22:59:17.476 (pid:5) ")
    assert bench.parse_starter_log(text)["131.0"].exited is not None


def test_start_log_pairs_activation_with_that_slots_starter_exit():
    slots = bench.parse_start_log(START_LOG)
    assert slots["131.0"][1] - slots["131.0"][0] == pytest.approx(2.0)
    assert slots["132.0"][1] - slots["132.0"][0] == pytest.approx(0.5)
    assert slots["999.0"][1] is None  # still running when the log was read


def test_measure_start_and_slot_times_and_checks_the_path():
    runs, slots = bench.parse_starter_log(STARTER_LOG), bench.parse_start_log(START_LOG)
    start, slot = bench.measure(runs, slots, ["131.0"], want_lark=True)
    assert start == [pytest.approx(1476.0)] and slot == [pytest.approx(2000.0)]
    start, slot = bench.measure(runs, slots, ["132.0"], want_lark=False)
    assert start == [pytest.approx(260.0)] and slot == [pytest.approx(500.0)]
    with pytest.raises(RuntimeError, match="132.0.*Lark start path"):
        bench.measure(runs, slots, ["132.0"], want_lark=True)
    with pytest.raises(RuntimeError, match="131.0.*plain start path"):
        bench.measure(runs, slots, ["131.0"], want_lark=False)
    with pytest.raises(RuntimeError, match="999.0: not complete"):
        bench.measure(runs, slots, ["999.0"], want_lark=True)


def test_percentile_nearest_rank():
    values = [float(v) for v in range(1, 101)]
    assert bench.percentile(values, 50) == 50.0
    assert bench.percentile(values, 99) == 99.0
    assert bench.percentile([7.0, 1.0, 3.0], 50) == 3.0
    assert bench.percentile([5.0], 99) == 5.0
    with pytest.raises(ValueError):
        bench.percentile([], 50)


def test_job_ad_start_is_executing_minus_start():
    assert bench.job_ad_start_s({"JobCurrentStartDate": "100", "JobCurrentStartExecutingDate": "102"}) == 2.0
    assert bench.job_ad_start_s({"JobCurrentStartDate": "100", "JobCurrentStartExecutingDate": None}) is None


def test_summary_line_is_the_difference_of_percentiles():
    lark = bench.Half("lark", 61.25, [100.0 + i for i in range(50)], [500.0] * 50, [1.0] * 50)
    plain = bench.Half("plain", 30.0, [40.0 + i for i in range(50)], [200.0] * 50, [0.0] * 50)
    line = bench.summary(lark, plain)
    assert line == ("jobs=50 wall_lark_s=61.2 wall_plain_s=30.0 start_p50_added_ms=60 start_p99_added_ms=60 "
                    "slot_p50_added_ms=300")
    out = bench.table([lark, plain])
    assert out.splitlines()[1].split()[:4] == ["lark", "50", "61.2", "124"]


def test_breakdown_medians_each_step_from_both_logs():
    text = STARTER_LOG.replace("11/23/26 22:59:17.500 HOOK_JOB_EXIT",
                               "11/23/26 22:59:17.900 ** condor_starter (condor_STARTER) pid 1 EXITING WITH STATUS 0\n"
                               "11/23/26 22:59:17.500 HOOK_JOB_EXIT")
    runs, slots = bench.parse_starter_log(text), bench.parse_start_log(START_LOG)
    steps = bench.breakdown(runs, slots, ["131.0"])
    assert list(steps.values()) == [pytest.approx(100.0), pytest.approx(729.0), pytest.approx(647.0),
                                    pytest.approx(424.0)]
    half = bench.Half("lark", 1.0, [1.0], [1.0], [], steps)
    assert "729" in bench.breakdown_table([half]).splitlines()[2]
