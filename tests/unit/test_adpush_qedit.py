"""All of a push's attributes in one schedd session (issue 27: the exit barrier paid one htcondor2 session per
attribute): `adpush.qedit_edit` runs `condor_qedit -name <schedd address> <job> -edits:new -` with the attributes
as one ClassAd on stdin. Here: the text it sends (parsed back with the real classad2), its command line (no
-forward: nothing marked dirty, as htcondor2's default), its errors, and the worker running a stand-in
condor_qedit (test_adpush_worker.py; the real one against a real schedd: bench/barrier.py)."""
from __future__ import annotations

import subprocess
import sys

import pytest

from lark.daemon import adpush

ATTRS = adpush.job_attributes({
    "plan": {"network_type": "bridge", "ipv4": "10.213.0.17", "rate_limit_mbit": 100.0},
    "usage": {"bytes_in": 52431, "bytes_out": 8121, "packets_in": 61, "packets_out": 44, "avg_in_bps": 10486.2}})


def test_the_edits_are_one_classad_with_every_attribute_and_its_literal_unchanged():
    classad2 = pytest.importorskip("classad2")
    attrs = dict(ATTRS, LarkNetworkType='"a\\"b c"')   # a string literal with an escaped quote
    text = adpush.qedit_edits(attrs)
    assert text.count("\n") == 1 and text.startswith("[ ") and text.endswith(" ]\n")
    ad = classad2.parseOne(text)
    assert set(ad.keys()) == set(attrs)
    assert ad["LarkNetworkType"] == 'a"b c'
    assert ad["NetworkIncomingBytes"] == 52431
    assert ad["LarkIPv4Address"] == "10.213.0.17"
    assert ad["NetworkInputMb"] == pytest.approx(0.052431)
    # each literal exactly as htcondor2's edit would send it
    for attr, literal in attrs.items():
        assert f"{attr} = {literal}" in text


@pytest.mark.parametrize("attrs, what", [
    ({"NetworkIncomingBytes": "1\nLarkFiguresBy = \"job\""}, "one-line"),   # a second attribute smuggled in
    ({"NetworkIncomingBytes": "  "}, "one-line"),
    ({"Network Bytes": "1"}, "attribute name"),
    ({"A;B": "1"}, "attribute name"),
    ({}, "no attributes"),
])
def test_a_name_or_literal_that_could_set_something_else_is_refused(attrs, what):
    with pytest.raises(ValueError, match=what):
        adpush.qedit_edits(attrs)


def test_the_command_names_the_schedd_and_job_and_never_forwards():
    argv = adpush.qedit_argv("/usr/bin/condor_qedit", "<10.0.0.1:9618?sock=schedd>", "12.3")
    assert argv == ["/usr/bin/condor_qedit", "-name", "<10.0.0.1:9618?sock=schedd>", "12.3", "-edits:new", "-"]
    assert "-forward" not in argv   # -forward would SetDirty: the shadow would write NetworkInputMb back later
    for bad in ("12", "12.3 -forward", "-constraint", "1.2.3"):
        with pytest.raises(ValueError, match="not a job id"):
            adpush.qedit_argv("/usr/bin/condor_qedit", "ap", bad)


@pytest.fixture
def located(monkeypatch):
    monkeypatch.setattr(adpush, "_schedd_locations", {"ap@host": {"Name": "ap@host", "MyAddress": "<10.0.0.1:9618>"}})
    return adpush._schedd_locations


def test_one_run_per_push_at_the_schedds_address(located):
    runs = []

    def run(argv, **kw):
        runs.append((argv, kw))
        return subprocess.CompletedProcess(argv, 0, "Set attribute ...\n", "")
    adpush.qedit_edit("ap@host", "4.0", ATTRS, run=run, which=lambda n: "/x/condor_qedit")
    assert len(runs) == 1
    argv, kw = runs[0]
    assert argv == ["/x/condor_qedit", "-name", "<10.0.0.1:9618>", "4.0", "-edits:new", "-"]
    assert kw["input"] == adpush.qedit_edits(ATTRS)
    assert "ap@host" in located   # kept for the next push


def test_a_job_the_schedd_no_longer_holds_is_a_lookup_error_naming_it(located):
    def run(argv, **kw):
        return subprocess.CompletedProcess(argv, 1, "", 'Failed to set attribute "LarkFiguresBy" for job 9.9.\n'
                                           "Queue transaction failed.  No attributes were set.\n")
    with pytest.raises(LookupError, match=r"no longer holds job 9\.9"):
        adpush.qedit_edit("ap@host", "9.9", ATTRS, run=run, which=lambda n: "/x/condor_qedit")
    assert "ap@host" not in located   # looked up again next time


def test_another_refusal_names_the_job_the_schedd_and_what_qedit_said(located):
    def run(argv, **kw):
        return subprocess.CompletedProcess(argv, 1, "", "Failed to connect to queue manager <10.0.0.1:9618>\n")
    with pytest.raises(RuntimeError, match=r"job 4.0 at schedd ap@host \(exit 1\): Failed to connect"):
        adpush.qedit_edit("ap@host", "4.0", ATTRS, run=run, which=lambda n: "/x/condor_qedit")


def test_no_condor_qedit_is_an_error_naming_the_fix(located, tmp_path):
    with pytest.raises(FileNotFoundError, match="install HTCondor's tools on this EP"):
        adpush.find_qedit(which=lambda n: None, bindir=str(tmp_path))
    with pytest.raises(FileNotFoundError, match=r"figures of job 4\.0 not pushed to schedd ap@host: condor_qedit is"):
        adpush.qedit_edit("ap@host", "4.0", ATTRS, which=lambda n: None, bindir=str(tmp_path))
    qedit = tmp_path / "condor_qedit"
    qedit.write_text("#!/bin/sh\n")
    qedit.chmod(0o755)
    assert adpush.find_qedit(which=lambda n: None, bindir=str(tmp_path)) == str(qedit)


def test_an_unknown_way_is_refused():
    with pytest.raises(ValueError, match="unknown edit way 'chirp'"):
        adpush.EditWorker(way="chirp")
    assert set(adpush.EDIT_WAYS) == {"qedit", "htcondor2", "htcondor2-nondurable"}
    assert sys.modules["lark.daemon.adpush"].EDIT_WAYS["htcondor2"] is adpush.htcondor_edit
