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


def test_a_leftover_temp_of_this_writer_is_replaced_and_a_planted_link_not_followed(tmp_path):
    """atomic_write removes its temp name only when the exclusive create finds something there: a dead writer's
    leftover (same pid and thread id) or a link someone planted; neither is written through."""
    import threading

    from lark.statefiles import TEMP_MARK
    p = tmp_path / "rec.json"
    tmp = tmp_path / f"rec.json{TEMP_MARK}{os.getpid()}.{threading.get_ident()}"
    tmp.write_text("half")
    atomic_write(str(p), "whole")
    assert p.read_text() == "whole" and os.listdir(tmp_path) == ["rec.json"]
    victim = tmp_path / "victim"
    victim.write_text("untouched")
    tmp.symlink_to(victim)
    atomic_write(str(p), "again")
    assert p.read_text() == "again" and victim.read_text() == "untouched"
    assert sorted(os.listdir(tmp_path)) == ["rec.json", "victim"]


def test_state_text_is_json_dumps_sorted(tmp_path):
    """The shared encoder writes what json.dumps(sort_keys=True, default=asdict) did: files of either load alike."""
    import dataclasses
    import json

    from lark.statefiles import STATE_JSON

    @dataclasses.dataclass
    class Inner:
        b: int = 2
        a: str = "x"

    obj = {"z": 1.5, "a": [1, None, True], "inner": Inner(), "u": "é\n", "n": {"y": {}, "b": 0}}
    assert STATE_JSON.encode(obj) == json.dumps(obj, sort_keys=True, default=dataclasses.asdict)
