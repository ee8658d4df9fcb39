"""`lark doctor`'s pidns line (lark/hostcheck.py): an execution point that clones jobs with NO_JOB_NETWORKING but
without USE_PID_NAMESPACES trips HTCondor's CreateProcessForkit::fork defect (the starter writes the job's pids into
an uninitialised fd); docs/admin.md, "Known HTCondor defects". HTCondor's configuration comes from a fake
condor_config_val."""
from __future__ import annotations

import pytest

from lark import hostcheck
from lark.config import Config


def condor_config(params: dict[str, str]) -> hostcheck.Runner:
    """condor_config_val NAME -> its value, exit 1 for an undefined knob (as the real tool); nothing else exists."""
    def run(argv: list[str]) -> tuple[int, str]:
        if argv[0] != "condor_config_val":
            return 127, ""
        value = params.get(argv[1])
        return (0, value + "\n") if value is not None else (1, "")
    return run


LARK_EP = {"STARTER": "/opt/lark/bin/lark-starter"}


@pytest.mark.parametrize("params", [LARK_EP, {**LARK_EP, "USE_PID_NAMESPACES": "False"},
                                    {"STARTER": "/usr/sbin/condor_starter", "NO_JOB_NETWORKING": "true"}])
def test_no_job_networking_without_pid_namespaces_is_reported_with_the_fix(params):
    f = hostcheck.pid_namespaces(condor_config(params))
    assert not f.ok and f.what == "pidns"
    assert "Unable to write into pipe." in f.action and "uninitialised file descriptor" in f.action
    assert "ENABLE_SSH_TO_JOB = False" in f.fix and "USE_PID_NAMESPACES = True" in f.fix


@pytest.mark.parametrize("value", ["True", "true", "1", "YES"])
def test_pid_namespaces_with_no_job_networking_are_ok_and_name_what_remains(value):
    f = hostcheck.pid_namespaces(condor_config({**LARK_EP, "USE_PID_NAMESPACES": value}))
    assert f.ok and not f.fix and "real pipe" in f.action and "condor_ssh_to_job's sshd" in f.action


def test_an_ep_without_no_job_networking_is_not_reported():
    assert hostcheck.pid_namespaces(condor_config({"STARTER": "/usr/sbin/condor_starter"})).ok
    assert hostcheck.pid_namespaces(condor_config({})).ok  # no HTCondor configuration at all


def test_doctor_shows_the_pidns_line_and_counts_it():
    run = condor_config(LARK_EP)
    findings = [f for f in hostcheck.check(Config(), run) if f.what == "pidns"]
    assert len(findings) == 1 and not findings[0].ok
    text, bad = hostcheck.report(findings)
    assert bad == 1 and "pidns      ACTION  NO_JOB_NETWORKING without USE_PID_NAMESPACES" in text

