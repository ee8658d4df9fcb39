"""The PREPARE_JOB hook's answer must be a ClassAd HTCondor can parse, whatever the error text holds."""
import classad2
from hypothesis import given, strategies as st

from lark.job import prepare_hook
from lark.job.prepare_hook import STATUS_REFUSED, hold_ad


@given(st.text(max_size=300))
def test_hold_ad_parses_and_keeps_the_reason_on_one_line(reason):
    ad = classad2.parseOne(hold_ad(STATUS_REFUSED, reason), classad2.ParserType.Old)
    assert ad["HookStatusCode"] == STATUS_REFUSED
    msg = ad["HookStatusMessage"]
    assert msg.startswith("Lark:")
    assert "\n" not in msg
    assert msg.isprintable()
    assert msg.replace(" ", "") == "Lark:" + "".join(c for c in reason.replace("\\", "/")
                                                      if c.isprintable() and not c.isspace())


def test_hold_ad_escapes_quotes_and_backslashes():
    ad = classad2.parseOne(hold_ad(111, 'job attribute IPProtocol = "IPX" bad\\'), classad2.ParserType.Old)
    assert ad["HookStatusMessage"] == 'Lark: job attribute IPProtocol = "IPX" bad/'


def test_larkd_down_is_held_as_transient_without_telling_the_admin_to_start_a_restarting_daemon(monkeypatch, capsys,
                                                                                               tmp_path):
    monkeypatch.setenv("LARK_SOCKET", str(tmp_path / "absent.sock"))
    monkeypatch.setenv("LARK_PREFLIGHT_WAIT", "0")
    monkeypatch.setattr(prepare_hook.sys, "stdin", __import__("io").StringIO("Owner = \"alice\"\n"))
    assert prepare_hook.main() == 1
    out = capsys.readouterr().out
    assert "HookStatusCode = 111" in out
    assert "released again automatically" in out and "start larkd" not in out, out
