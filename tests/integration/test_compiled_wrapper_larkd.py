"""The compiled wrapper's fast path (lark/job/launcher/job_wrapper.c) with a real larkd on the fake execution point:
a job it starts is networked (it reaches the world through NAT, seen as the host); a job larkd refuses (left in the
starter's netns) never runs and ends 111 with larkd's reason; neither takes the Python fallback (here a stub that
runs nothing and ends 99)."""
from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest
from helpers.fakehost import HOST_IP, JOB_PY, WORLD_IP, sh

REPO = Path(__file__).resolve().parents[2]
SOURCE = REPO / "lark" / "job" / "launcher" / "job_wrapper.c"
WORKLOAD = REPO / "tests" / "helpers" / "workload.py"
FALLBACK_CODE = 99


@pytest.fixture(scope="module")
def compiled():
    """The C program; its fallback here runs nothing and ends FALLBACK_CODE, so a job that ran took the fast path."""
    d = Path(tempfile.mkdtemp(prefix="lark-jwc-", dir="/tmp"))
    d.chmod(0o755)
    fallback = d / "fallback"
    fallback.write_text(f"#!/bin/sh\necho 'the Python wrapper was asked' >&2\nexit {FALLBACK_CODE}\n")
    fallback.chmod(0o755)
    out = d / "lark-job-wrapper-fast"
    subprocess.run(["gcc", "-O2", "-Wall", "-Wextra", "-Werror", f"-DLARK_PY_WRAPPER=\"{fallback}\"", "-o", str(out),
                    str(SOURCE)], check=True)
    yield out
    shutil.rmtree(d, ignore_errors=True)


def run(host, compiled: Path, slot: str, workload: list[str], job_ad: str, host_netns: bool = False):
    host.publish_ad(slot, job_ad)
    argv = [host.starter, "-a", slot, "-u", "65534", *(["-H"] if host_netns else []), "--", "env",
            f"LARK_SOCKET={host.cfg.socket}", f"PYTHONPATH={REPO}", str(compiled), JOB_PY, str(WORKLOAD), *workload]
    return sh(host.in_host(argv), check=False, timeout=60)


def test_a_job_started_by_the_fast_path_is_networked(host, compiled):
    cp = run(host, compiled, "slot1", ["whoami", WORLD_IP, "7000"], "ClusterId = 31\nProcId = 0")
    assert cp.returncode == 0, cp.stderr + host.larkd_log()
    assert json.loads(cp.stdout)["seen_as"] == HOST_IP
    assert "networked job 31.0" in host.larkd_log()
    assert host.wait_clean() == {k: [] for k in host.residue()}


def test_a_job_larkd_refuses_never_runs(host, compiled):
    cp = run(host, compiled, "slot2", ["whoami", WORLD_IP, "7000"], "ClusterId = 32\nProcId = 0", host_netns=True)
    assert cp.returncode == 111, cp.stdout + cp.stderr
    assert "seen_as" not in cp.stdout, "the job ran without its network"
    assert cp.stderr.startswith("Lark: job not started, its network could not be set up: larkd: "), cp.stderr
