"""`lark gc`: with larkd up it asks larkd to sweep; `--purge` (the shared objects) needs larkd stopped and says so."""
import argparse
from types import SimpleNamespace

from lark import cli
from lark.errors import DaemonUnreachable, LarkError


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


def test_purge_goes_on_past_a_failing_step_and_gc_exits_1(monkeypatch, capsys):
    def destroy_base():
        raise LarkError("cannot delete table inet lark", obj="nft")
    fw = SimpleNamespace(name="nftables", destroy_base=destroy_base)
    sandbox = SimpleNamespace(purge=lambda: ["nft table inet lark_sandbox"])
    net = SimpleNamespace(dns=SimpleNamespace(stop=lambda: True))
    actions = cli._purge_steps(fw, sandbox, net)
    assert actions[0].startswith("base firewall objects (incomplete: ") and "cannot delete table" in actions[0]
    assert actions[1:] == ["nft table inet lark_sandbox", "DNS forwarder"]

    def unreachable(op, **kw):
        raise DaemonUnreachable("larkd is not running")
    monkeypatch.setattr(cli, "call", unreachable)
    monkeypatch.setattr(cli, "_offline_gc", lambda args: actions)
    assert cli.cmd_gc(_args(purge=True)) == 1
    assert "some objects were not removed" in capsys.readouterr().err
    monkeypatch.setattr(cli, "_offline_gc", lambda args: actions[1:])
    assert cli.cmd_gc(_args(purge=True)) == 0
