"""A submitter's own transfer plugin never runs on a Lark execution point (issue 22, "nothing a submitter supplies
runs with the host's network").

The access point refuses `transfer_plugins` at submit (test_condor_transfer.py) and protects TransferPlugins from
the submitter's condor_qedit. These tests give a job its own plugin the way a schedd without Lark's configuration
would (root, a queue super user, edits the held job's ad), release it, and check the execution point: its START
(50-lark.conf) never matches such a job; with that clause off, Lark's pre-flight (PREPARE_JOB) holds a job whose
plugin is for its output before it starts. The plugin, which would leave a marker file, never runs.
"""
import contextlib
import secrets
import time

import pytest
from condor import as_root, as_user, history, job, submit, testbed, wait_queue

pytestmark = pytest.mark.e2e

EP_CONF = "etc/condor/config.d/99-test-start-without-lark-plugin-clause.conf"


def held_job_with_its_own_plugin(name: str, url_attr: str = "TransferInput",
                                  url: str = '"evil.sh,evil://host/x"') -> tuple[int, list]:
    """A job (held at submit) whose ad a queue super user gave its own plugin and an evil:// URL (an input, or with
    url_attr = "OutputDestination" where its output goes); released.
    Returns the cluster and the marker files the plugin would write (in /tmp and in the submit directory)."""
    tag = secrets.token_hex(4)
    d = testbed.ROOT / "home/alice" / name
    d.mkdir(parents=True, exist_ok=True)
    markers = [testbed.ROOT / f"tmp/lark-evil-{tag}", d / f"evil-ran-{tag}"]
    (d / "evil.sh").write_text("#!/bin/sh\n" + "".join(f"echo \"$@\" >> /{m.relative_to(testbed.ROOT)}\n"
                                                       for m in markers) + "ip -o addr >&2\nexit 0\n")
    (d / "evil.sh").chmod(0o755)
    c = submit(name, job(exe="/bin/true", inputs=("evil.sh",), extra="hold = true"))
    # The submitter cannot add a plugin after submit: TransferPlugins is protected at the access point.
    denied = as_user(["condor_qedit", str(c), "TransferPlugins", '"evil=evil.sh"'])
    assert denied.returncode != 0, denied.stdout
    assert as_root(["condor_q", str(c), "-af", "TransferPlugins"]).stdout.strip() == "undefined"
    for attr, value in (("TransferPlugins", '"evil=evil.sh"'), (url_attr, url)):
        cp = as_root(["condor_qedit", str(c), attr, value])
        assert cp.returncode == 0, cp.stderr
    assert as_user(["condor_release", str(c)]).returncode == 0
    return c, markers


def held_for(c: int, timeout: float = 120) -> list[str]:
    """HoldReasonCode, HoldReasonSubCode, HoldReason of the job once it is held after its release."""
    wait_queue(c, ["JobStatus", "NumJobStarts", "HoldReasonCode"],
               lambda r: r[0] == "5" and r[2] not in ("1", "undefined"), timeout=timeout)
    return as_root(["condor_q", str(c), "-af:t", "HoldReasonCode", "HoldReasonSubCode", "HoldReason"]
                   ).stdout.strip().split("\t")


def remove(c: int) -> None:
    as_root(["condor_rm", str(c)])
    deadline = time.time() + 60
    while time.time() < deadline and as_root(["condor_q", str(c), "-af", "ProcId"]).stdout.strip():
        time.sleep(1)


def test_a_job_that_reaches_the_ep_with_its_own_plugin_is_never_matched(pool):
    c, markers = held_job_with_its_own_plugin("plug-start")
    try:
        # A job submitted after it runs and finishes: the negotiator has had its cycles, and passed this one by.
        plain = submit("plug-start-plain", job(exe="/bin/true"))
        assert history(plain, ["ExitCode"], timeout=180) == ["0"]
        # never matched: no shadow was ever started for it (HTCondor's starter alone would refuse the plugin, but
        # the job would be evicted and matched again and again)
        status, shadows = as_root(["condor_q", str(c), "-af", "JobStatus", "NumShadowStarts"]).stdout.split()
        assert status == "1" and shadows in ("0", "undefined"), (status, shadows)
        for m in markers:
            assert not m.exists(), f"the job's own plugin ran: {m}"
    finally:
        remove(c)


@contextlib.contextmanager
def ep_config(text: str):
    """The pool with one more configuration file, for the test's length (then removed and reconfigured)."""
    conf = testbed.ROOT / EP_CONF
    conf.write_text(text)
    try:
        assert as_root(["condor_reconfig"]).returncode == 0
        time.sleep(2)
        yield
    finally:
        conf.unlink(missing_ok=True)
        as_root(["condor_reconfig"])


def test_without_the_start_clause_lark_holds_a_job_whose_own_plugin_sends_its_output(pool):
    """Lark's pre-flight refuses TransferPlugins (lark/policy/transfers.py), so such a job is held before it runs
    and its output plugin is never reached (an input plugin would already have been refused by HTCondor's starter:
    STARTER_DISABLE_USER_SUPPLIED_TRANSFER_PLUGINS)."""
    with ep_config("START = True\n"):
        assert "TransferPlugins" not in as_root(["condor_config_val", "START"]).stdout
        c, markers = held_job_with_its_own_plugin("plug-lark", "OutputDestination", '"evil://host/out/"')
        try:
            code, subcode, reason = held_for(c)
            assert (code, subcode) == ("19", "112"), reason       # Lark's PREPARE_JOB refusal: stays held
            assert "own transfer plugin" in reason and "TransferPlugins = evil=evil.sh" in reason, reason
            assert "remove transfer_plugins" in reason, reason
            for m in markers:
                assert not m.exists(), f"the job's own plugin ran: {m}"
        finally:
            remove(c)


def test_doctor_says_this_ep_refuses_a_jobs_own_plugin(pool):
    out = as_root(["lark", "doctor"]).stdout
    assert "plugins    ok" in out and "never matched to this EP" in out, out
