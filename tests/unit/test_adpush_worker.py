"""larkd edits job ads at the schedd from a child process (adpush.EditWorker): htcondor2 keeps the GIL while it
waits for the schedd, which froze the whole of larkd (its event loop, other jobs' setups and exit barriers) for
every edit (issue 27). The fake htcondor2 here holds the GIL the same way (a C call through ctypes.PyDLL)."""
from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path

import pytest

from lark.daemon import adpush

REPO = Path(__file__).resolve().parents[2]

FAKE_HTCONDOR2 = '''
import ctypes, os
class DaemonType:
    Schedd = 1
class JobAction:
    Hold = 2
class Collector:
    def locate(self, daemon_type, name=None):
        return {"Name": name, "MyAddress": "<127.0.0.1:9618?name=" + name + ">"}
class Schedd:
    def __init__(self, loc):
        self.loc = loc
    def edit(self, job_id, attr, value):
        if job_id == "9.9":
            return 0
        ctypes.PyDLL(None).usleep(int(os.environ.get("FAKE_EDIT_US", "0")))  # with the GIL held, like htcondor2
        with open(os.environ["FAKE_EDITS"], "a") as f:
            f.write(f"{self.loc['Name']} {job_id} {attr}={value}\\n")
        return 1
    def act(self, action, job_id, reason=None):
        with open(os.environ["FAKE_EDITS"], "a") as f:
            f.write(f"hold {job_id} {reason[0]}\\n")
        return {"TotalSuccess": 1}
'''


@pytest.fixture
def fake_condor(tmp_path, monkeypatch):
    mods = tmp_path / "mods"
    mods.mkdir()
    (mods / "htcondor2.py").write_text(FAKE_HTCONDOR2)
    (mods / "classad2.py").write_text("ExprTree = str\n")
    edits = tmp_path / "edits.txt"
    edits.touch()
    monkeypatch.setenv("PYTHONPATH", f"{mods}{os.pathsep}{REPO}")
    monkeypatch.setenv("FAKE_EDITS", str(edits))
    return mods, edits


def spins_during(work) -> int:
    """How many turns a Python thread of this process gets while `work` runs."""
    turns, stop = [0], threading.Event()

    def spin() -> None:
        while not stop.is_set():
            turns[0] += 1
            time.sleep(0)
    t = threading.Thread(target=spin)
    t.start()
    try:
        work()
    finally:
        stop.set()
        t.join()
    return turns[0]


def test_edits_go_through_the_worker_and_larkd_keeps_running_meanwhile(fake_condor, monkeypatch):
    mods, edits = fake_condor
    monkeypatch.setenv("FAKE_EDIT_US", "300000")
    worker = adpush.EditWorker(way="htcondor2")
    worker.start()
    try:
        time.sleep(0.5)   # the worker's imports are done before the edit, as in larkd
        turns = spins_during(lambda: worker.edit("ap", "4.0", {"NetworkIncomingBytes": "7", "LarkFiguresBy": '"ep"'}))
        assert edits.read_text().splitlines() == ["ap 4.0 NetworkIncomingBytes=7", 'ap 4.0 LarkFiguresBy="ep"']
        # The same edit in larkd's own process: the other thread waits for the whole of it.
        sys.path.insert(0, str(mods))
        for name in ("htcondor2", "classad2"):
            sys.modules.pop(name, None)
        monkeypatch.setattr(adpush, "_schedd_locations", {})
        try:
            in_process = spins_during(lambda: adpush.htcondor_edit("ap", "4.0", {"NetworkIncomingBytes": "8"}))
        finally:
            sys.path.remove(str(mods))
            for name in ("htcondor2", "classad2"):
                sys.modules.pop(name, None)
        # 300 ms of GIL held in process: turns only before and after it (file writes); thousands through the worker
        assert turns > 10 * in_process, (in_process, turns)
    finally:
        worker.stop()


def test_a_refused_edit_is_an_error_naming_the_job_and_a_dead_worker_is_replaced(fake_condor):
    _, edits = fake_condor
    worker = adpush.EditWorker(way="htcondor2")
    try:
        with pytest.raises(RuntimeError, match=r"no longer holds job 9\.9"):
            worker.edit("ap", "9.9", {"NetworkIncomingBytes": "1"})
        assert worker.proc is not None
        worker.proc.kill()
        worker.proc.wait()
        worker.hold("ap", "5.0", "Lark: job not started")
        assert edits.read_text().splitlines() == ["hold 5.0 Lark: job not started"]
    finally:
        worker.stop()
    assert worker.proc is None


def test_the_pusher_uses_a_worker_unless_given_its_own_edit():
    assert adpush.AdPusher().worker is not None
    p = adpush.AdPusher(edit=lambda s, j, a: None, hold=lambda s, j, r: None)
    assert p.worker is None


FAKE_QEDIT = '''#!/bin/sh
# a stand-in condor_qedit: its argv and stdin into $FAKE_EDITS; job 9.9 is gone
{ echo "$*"; cat; } >> "$FAKE_EDITS"
case "$*" in *" 9.9 "*) echo 'Failed to set attribute "A" for job 9.9.' >&2; exit 1;; esac
'''


def test_the_qedit_way_sends_every_attribute_in_one_condor_qedit_run(fake_condor, tmp_path, monkeypatch):
    _, edits = fake_condor
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "condor_qedit").write_text(FAKE_QEDIT)
    (bindir / "condor_qedit").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ.get('PATH', '')}")
    worker = adpush.EditWorker(way="qedit")
    assert worker.argv[-1] == "--worker"   # the way goes with each edit
    try:
        worker.edit("ap", "4.0", {"NetworkIncomingBytes": "7", "LarkFiguresBy": '"ep"'})
        assert edits.read_text().splitlines() == ["-name <127.0.0.1:9618?name=ap> 4.0 -edits:new -",
                                                  '[ NetworkIncomingBytes = 7; LarkFiguresBy = "ep" ]']
        with pytest.raises(RuntimeError, match=r"LookupError: the schedd no longer holds job 9\.9"):
            worker.edit("ap", "9.9", {"A": "1"})
    finally:
        worker.stop()
