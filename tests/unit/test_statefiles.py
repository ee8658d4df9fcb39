import os
import subprocess

from lark.statefiles import atomic_write, remove_stale_temps


def test_atomic_write_replaces_and_leaves_no_temp(tmp_path):
    p = tmp_path / "rec.json"
    atomic_write(str(p), "one")
    atomic_write(str(p), "two")
    assert p.read_text() == "two" and os.listdir(tmp_path) == ["rec.json"]


def test_only_temps_of_dead_writers_are_removed(tmp_path):
    dead = subprocess.Popen(["true"])
    dead.wait()
    (tmp_path / f"a.json.tmp.{dead.pid}.1").write_text("x")
    (tmp_path / f"b.json.tmp.{os.getpid()}.2").write_text("x")   # this process: a writer mid-write
    (tmp_path / "c.json.tmp.1.3").write_text("x")                 # pid 1 runs
    (tmp_path / "d.json").write_text("x")
    assert remove_stale_temps(str(tmp_path)) == [f"a.json.tmp.{dead.pid}.1"]
    assert sorted(os.listdir(tmp_path)) == [f"b.json.tmp.{os.getpid()}.2", "c.json.tmp.1.3", "d.json"]
    assert remove_stale_temps(str(tmp_path / "missing")) == []
