"""forward_policy: when Lark's firewall confines forwarding to Lark's own traffic."""
import pytest

from lark.config import Config
from lark.errors import LarkError
from lark.kernel import forwarding
from lark.kernel.sections import ForwardingSection


def cfg(tmp_path, **kw):
    return ForwardingSection.from_config(Config(run_dir=str(tmp_path / "run"), state_dir=str(tmp_path / "state"),
                                                **kw).validate())


def sysctl(tmp_path, value):
    p = tmp_path / "ip_forward"
    p.write_text(value + "\n")
    return str(p)


def test_auto_confines_forwarding_only_when_lark_turned_it_on(tmp_path):
    c = cfg(tmp_path)
    forwarding.claim(c, sysctl(tmp_path, "1"))       # someone else routes here already
    assert not forwarding.lark_only(c)
    forwarding.claim(c, sysctl(tmp_path, "0"))       # Lark is the one turning it on
    assert forwarding.lark_only(c)
    forwarding.claim(c, sysctl(tmp_path, "1"))       # a larkd restart finds it on, but Lark's marker stays
    assert forwarding.lark_only(c)


def test_explicit_policies_and_no_forwarding(tmp_path):
    assert forwarding.lark_only(cfg(tmp_path, forward_policy="lark-only"))
    forwarding.claim(cfg(tmp_path), sysctl(tmp_path, "0"))
    assert not forwarding.lark_only(cfg(tmp_path, forward_policy="any"))
    off = cfg(tmp_path / "b", enable_ip_forward=False)
    forwarding.claim(off, sysctl(tmp_path, "0"))
    assert not forwarding.lark_only(off)


def test_bad_policy_is_refused():
    with pytest.raises(LarkError, match="forward_policy"):
        Config(forward_policy="sometimes").validate()
