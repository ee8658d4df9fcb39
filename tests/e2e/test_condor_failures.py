"""Failure never runs a job without its network: it is held with a one-line reason that names Lark."""
import time

import pytest

from condor import as_root, history, job, submit, wait_queue
from condor import starts as starts_of

pytestmark = pytest.mark.e2e
HELD = "5"


@pytest.fixture
def larkd_stopped(pool):
    cp = as_root(["condor_off", "-daemon", "LARKD"])
    assert cp.returncode == 0, cp.stderr
    deadline = time.time() + 20
    while time.time() < deadline and as_root(["lark", "status"]).returncode == 0:
        time.sleep(0.5)
    yield
    as_root(["condor_on", "-daemon", "LARKD"])
    deadline = time.time() + 30
    while time.time() < deadline and as_root(["lark", "status"]).returncode != 0:
        time.sleep(0.5)
    assert as_root(["lark", "status"]).returncode == 0, "larkd did not come back"


def test_larkd_down_holds_job_with_reason_then_release_runs_it_networked(pool, larkd_stopped):
    c = submit("down", job(exe="/bin/sh", args="-c 'ls /sys/class/net'"))
    status, reason, code, sub, starts = wait_queue(
        c, ["JobStatus", "HoldReason", "HoldReasonCode", "HoldReasonSubCode", "NumJobStarts"],
        lambda r: r[0] == HELD, timeout=120)
    assert "Lark" in reason and "larkd is not running" in reason, reason
    assert (code, sub) == ("19", "111")
    assert "\n" not in reason
    # The job process never started, so nothing ran without a network.
    assert starts in ("0", "undefined")
    as_root(["condor_on", "-daemon", "LARKD"])
    deadline = time.time() + 30
    while time.time() < deadline and as_root(["lark", "status"]).returncode != 0:
        time.sleep(0.5)
    assert as_root(["condor_release", str(c)]).returncode == 0
    # The hold (caused here) shows in its event log as an eviction before any start; after the release it runs
    # exactly once.
    mode, exit_code = history(c, ["LarkNetworkType", "ExitCode"], once=False)
    assert (mode, exit_code) == ("nat", "0")
    assert starts_of(c) == {0: ["evicted", "execute"]}


def test_policy_error_holds_job_naming_attribute(pool):
    c = submit("badproto", job(exe="/bin/true", extra='+IPProtocol = "IPX"'))
    status, reason, sub = wait_queue(c, ["JobStatus", "HoldReason", "HoldReasonSubCode"],
                                     lambda r: r[0] == HELD, timeout=120)
    assert sub == "112"
    assert "Lark" in reason and "IPProtocol" in reason and "IPX" in reason, reason
    as_root(["condor_rm", str(c)])
