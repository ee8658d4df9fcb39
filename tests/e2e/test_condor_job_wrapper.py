"""The job wrapper HTCondor runs (USER_JOB_WRAPPER = $(LARK_JOB_WRAPPER), condor_config.d/50-lark.conf) on the
pool: the job's parent is that wrapper itself (the compiled one when `lark install-hook` built it: no Python in
between, no fallback), it holds the exit barrier (the job's final figures are in its history, it started once),
and the job's end reaches HTCondor as the program ended: its exit code, or the signal that killed it."""
import os

import pytest
from condor import as_root, history, job, out_of, submit, submit_script, testbed

pytestmark = pytest.mark.e2e

PARENT = """import os, sys
ppid = os.getppid()
print(os.readlink(f"/proc/{ppid}/exe"))
print(" ".join(open(f"/proc/{ppid}/cmdline", "rb").read().decode().split("\\0")))
sys.exit(3)
"""


def wrapper_in_root() -> tuple[str, bool]:
    """USER_JOB_WRAPPER as the EP reads it, and whether that file is a compiled program."""
    path = as_root(["condor_config_val", "USER_JOB_WRAPPER"]).stdout.strip()
    real = os.path.realpath(testbed.ROOT / path.lstrip("/"))
    with open(real, "rb") as f:
        return path, f.read(4) == b"\x7fELF"


def test_the_jobs_parent_is_the_configured_wrapper_and_the_barrier_holds(pool):
    path, compiled = wrapper_in_root()
    cluster = submit_script("jobwrapper", PARENT)
    code, inbytes = history(cluster, ["ExitCode", "NetworkIncomingBytes"])
    assert code == "3"
    assert inbytes != "undefined", "the exit barrier's final push did not reach the job's history"
    exe, cmdline = out_of("jobwrapper").splitlines()[:2]
    assert path in cmdline.split()[:2], f"the job's parent is {cmdline!r}, not USER_JOB_WRAPPER {path!r}"
    if compiled:
        assert exe == os.path.realpath(testbed.ROOT / path.lstrip("/")).removeprefix(str(testbed.ROOT)), (
            f"the compiled wrapper handed the job to {exe} (its Python fallback) on the common path")
    else:
        assert os.path.basename(exe).startswith("python"), exe


def test_a_job_killed_by_a_signal_is_seen_killed_by_it(pool):
    cluster = submit("jobwrapper_sig", job(exe="/bin/sh", args="-c 'kill -USR1 $$'"))
    by_signal, sig = history(cluster, ["ExitBySignal", "ExitSignal"])
    assert (by_signal, sig) == ("true", "10")
