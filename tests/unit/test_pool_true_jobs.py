"""The pure parts of bench/pool_true_jobs.py: log parsing, per-job arithmetic, percentiles, the summary line, the
submit file and the refusal of a run whose jobs started more than once."""
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

# Two starters of one slot, as HTCondor 25 writes them with STARTER_DEBUG = D_SUB_SECOND (no "(pid:N)"): a Lark
# one (the PREPARE_JOB hook, named by its type, and the job wrapper, which holds the exit barrier: no JOB_EXIT hook)
# and a plain one.
STARTER_LOG = """\
11/23/26 22:59:16.100 ******************************************************
11/23/26 22:59:16.100 ** condor_starter (CONDOR_STARTER) STARTING UP
11/23/26 22:59:16.650 File transfer completed successfully.
11/23/26 22:59:16.700 PREPARE_JOB (/opt/lark/bin/lark-prepare-job) invoked.
11/23/26 22:59:16.710 Job 131.0 set to execute immediately
11/23/26 22:59:16.722 Starting a VANILLA universe job with ID: 131.0
11/23/26 22:59:16.800 Using wrapper /opt/lark/bin/lark-job-wrapper to exec /bin/true
11/23/26 22:59:16.829 Create_Process succeeded, pid=367106
11/23/26 22:59:17.476 Process exited, pid=367106, status=0
11/23/26 22:59:17.600 File transfer completed successfully.
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
    assert lark.wrapper == "/opt/lark/bin/lark-job-wrapper" and lark.hooks == ["PREPARE_JOB"]
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


def test_hooks_are_named_without_the_hook_prefix_whatever_the_starter_writes():
    text = STARTER_LOG.replace(
        "11/23/26 22:59:17.600 File transfer",
        "11/23/26 22:59:17.500 HOOK_JOB_EXIT (/opt/lark/bin/lark-hook) invoked with reason: \"exit\"\n"
        "11/23/26 22:59:17.510 HOOK_UPDATE_JOB_INFO (/usr/local/bin/a hook) invoked.\n"
        "11/23/26 22:59:17.600 File transfer")
    assert bench.parse_starter_log(text)["131.0"].hooks == ["PREPARE_JOB", "JOB_EXIT", "UPDATE_JOB_INFO"]


def test_the_lark_path_needs_the_wrapper_and_the_prepare_job_hook_and_plain_needs_neither():
    runs, slots = bench.parse_starter_log(STARTER_LOG), bench.parse_start_log(START_LOG)
    runs["131.0"].hooks = []                                   # the wrapper without the hook
    with pytest.raises(RuntimeError, match="131.0.*Lark start path"):
        bench.measure(runs, slots, ["131.0"], want_lark=True)
    runs["132.0"].hooks = ["PREPARE_JOB"]                      # a "plain" job that still ran Lark's hook
    with pytest.raises(RuntimeError, match="132.0.*plain start path"):
        bench.measure(runs, slots, ["132.0"], want_lark=False)


def test_jobs_use_file_transfer_with_the_eps_own_program():
    sub = bench.SUBMIT.format(n=50)
    for line in ("executable = /bin/true", "transfer_executable = false", "should_transfer_files = YES",
                 "when_to_transfer_output = ON_EXIT", "log = job.log", "queue 50"):
        assert line + "\n" in sub
    assert "should_transfer_files = NO" not in sub


def test_a_half_whose_jobs_restarted_is_named_job_by_job(tmp_path):
    log = tmp_path / "job.log"
    log.write_text(
        "000 (042.000.000) 2026-11-25 17:56:29 Job submitted from host: <10.77.0.2:9618>\n...\n"
        "000 (042.001.000) 2026-11-25 17:56:29 Job submitted from host: <10.77.0.2:9618>\n...\n"
        "000 (042.002.000) 2026-11-25 17:56:29 Job submitted from host: <10.77.0.2:9618>\n...\n"
        "001 (042.000.000) 2026-11-25 17:56:38 Job executing on host: <10.77.0.11:9618?addrs=10.77.0.11-9618>\n"
        "\tSlotName: slot1@ep1\n...\n"
        "001 (042.001.000) 2026-11-25 17:56:38 Job executing on host: <10.77.0.12:9618?addrs=10.77.0.12-9618>\n...\n"
        "004 (042.001.000) 2026-11-25 17:56:39 Job was evicted. Code 1008 Subcode 0\n"
        "\t(0) CPU times\n\tReason: Job not found at execution machine\n...\n"
        "001 (042.001.000) 2026-11-25 17:56:48 Job executing on host: <10.77.0.12:9618?addrs=10.77.0.12-9618>\n...\n"
        "005 (042.000.000) 2026-11-25 17:56:40 Job terminated.\n\t(1) Normal termination (return value 0)\n...\n")
    assert bench.restarts(log, 42, 3) == [
        "job 42.1: started 2 times; its event log shows execute, evicted, execute",
        "job 42.2: its event log shows no start"]
    assert bench.restarts(log, 42, 1) == []
    assert issubclass(bench.Restarted, RuntimeError)


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
    text = STARTER_LOG.replace("11/23/26 22:59:17.600 File transfer completed successfully.\n",
                               "11/23/26 22:59:17.600 File transfer completed successfully.\n"
                               "11/23/26 22:59:17.900 ** condor_starter (condor_STARTER) pid 1 EXITING WITH STATUS 0\n")
    runs, slots = bench.parse_starter_log(text), bench.parse_start_log(START_LOG)
    steps = bench.breakdown(runs, slots, ["131.0"])
    assert list(steps.values()) == [pytest.approx(100.0), pytest.approx(729.0), pytest.approx(647.0),
                                    pytest.approx(424.0)]
    half = bench.Half("lark", 1.0, [1.0], [1.0], [], steps)
    assert "729" in bench.breakdown_table([half]).splitlines()[2]


def test_barriers_come_from_larkds_log_and_every_goal_is_met_or_missed():
    text = ("2026-11-26 04:40:01,100 INFO lark.daemon.server: exit barrier of job 131.0: pushed in 12.5 ms "
            "(counters 0.9 ms, schedd 11.6 ms)\n"
            "2026-11-26 04:40:02,100 INFO lark.daemon.server: exit barrier of job 132.0: not pushed in 30.0 ms "
            "(counters 0.9 ms, schedd 29.1 ms)\n"
            "2026-11-26 04:40:03,100 INFO lark.daemon.server: networked job 133.0 on slot1: bridge - in 9.0 ms\n")
    assert bench.parse_barriers(text) == {"131.0": 12.5, "132.0": 30.0}
    lark = bench.Half("lark", 11.0, [100.0 + i for i in range(50)], [500.0] * 50, [], barrier_ms=[12.5] * 50)
    plain = bench.Half("plain", 10.0, [40.0 + i for i in range(50)], [450.0] * 50, [])
    line = bench.final_line(lark, plain)
    assert line.endswith("wall_ratio=1.10 barrier_p50_ms=12.5 barrier_p99_ms=12.5 goals_met=4/5 "
                         "missed=start_p50_added_ms")
    table = bench.goals.table(bench.issue27_goals(lark, plain))
    assert [row.split()[-1] for row in table.splitlines()[1:]] == ["missed", "met", "met", "met", "met"]
    lark.barrier_ms = []
    assert "barrier_p50_ms" in bench.final_line(lark, plain).split("missed=")[1]


def test_the_barriers_parts_are_read_by_name():
    text = ("x: exit barrier of job 1.0: pushed in 9.0 ms (peer 0.5 ms, counters 1.0 ms, push thread busy 2.5 ms, "
            "schedd 5.0 ms)\nx: exit barrier of job 2.0: pushed in 3.0 ms (counters 1.0 ms, schedd 2.0 ms)\n")
    assert bench.parse_barriers(text) == {"1.0": 9.0, "2.0": 3.0}
    assert bench.barrier_parts(text) == {"peer": [0.5], "counters": [1.0, 1.0], "push thread busy": [2.5],
                                         "schedd": [5.0, 2.0]}
