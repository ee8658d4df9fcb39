"""`lark gc`: with larkd up it asks larkd to sweep; `--purge` (the shared objects) needs larkd stopped and says so."""
import argparse

from lark import cli


def _args(purge: bool = False, dry_run: bool = False) -> argparse.Namespace:
    return argparse.Namespace(socket="/nonexistent", dry_run=dry_run, purge=purge, config=None)


def test_purge_with_larkd_up_sweeps_then_says_it_needs_larkd_stopped(monkeypatch, capsys):
    monkeypatch.setattr(cli, "call", lambda op, **kw: {"actions": ["slot1: record"]})
    offline: list = []
    monkeypatch.setattr(cli, "_offline_gc", lambda args: offline.append(args) or [])
    assert cli.cmd_gc(_args(purge=True)) == 1
    out, err = capsys.readouterr()
    assert out == "removed slot1: record\n" and "--purge needs larkd stopped" in err and offline == []
    assert cli.cmd_gc(_args()) == 0                          # a plain gc with larkd up is larkd's sweep
    assert cli.cmd_gc(_args(purge=True, dry_run=True)) == 0  # a dry run purges nothing anyway
    assert "needs larkd stopped" not in capsys.readouterr().err
