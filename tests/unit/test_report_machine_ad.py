"""`lark machine-ad`: the ClassAd lines STARTD_CRON merges into the machine ad."""
import classad2

from lark.report import machine_ad


def test_totals_become_classad_attributes(monkeypatch, capsys):
    monkeypatch.setattr(machine_ad, "call", lambda op, **kw: {"ok": True, "active_jobs": 3, "bytes_in": 10**12,
                                                              "bytes_out": 5, "avail_bandwidth_mbit": 400.0})
    assert machine_ad.run(type("A", (), {"socket": None})()) == 0
    ad = classad2.parseOne(capsys.readouterr().out)
    assert ad.eval("LarkActiveJobs") == 3 and ad.eval("LarkBytesIn") == 10**12
    assert ad.eval("LarkAvailBandwidth") == 400 and ad.eval("LarkDaemonUp") is True


def test_daemon_down_is_said_not_hidden(monkeypatch, capsys):
    from lark.errors import DaemonUnreachable

    def down(op, **kw):
        raise DaemonUnreachable("larkd is not running (no socket)", obj="/run/lark/lark.sock")
    monkeypatch.setattr(machine_ad, "call", down)
    assert machine_ad.run(type("A", (), {"socket": None})()) == 0
    ad = classad2.parseOne(capsys.readouterr().out)
    assert ad.eval("LarkDaemonUp") is False and "LarkBytesIn" not in ad


def test_no_bandwidth_known_leaves_attribute_out():
    assert "LarkAvailBandwidth" not in machine_ad.attributes({"active_jobs": 0, "bytes_in": 0, "bytes_out": 0})
