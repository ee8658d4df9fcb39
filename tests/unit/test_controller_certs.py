"""`lark-controller certs`: roles in the certificates and a switch's datapath id bound to its certificate (issue 26),
and the [openflow] knobs that make OpenFlow TLS-only by default."""
from pathlib import Path

import pytest
from cryptography import x509

from lark.controller import certs
from lark.controller.config import from_mapping
from lark.errors import LarkError


def der(d: Path, name: str) -> bytes:
    from cryptography.hazmat.primitives.serialization import Encoding
    return x509.load_pem_x509_certificate((d / f"{name}.pem").read_bytes()).public_bytes(Encoding.DER)


@pytest.fixture(scope="module")
def tls(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("tls")
    made = certs.make(str(d), ["controller=127.0.0.1", "ep1", "switch:0x00000000000c0de1",
                               "switch:00:00:00:00:00:00:0a:01"])
    assert made == ["controller", "ep1", "switch-00000000000c0de1", "switch-0000000000000a01"]
    return d


def test_each_certificate_carries_its_role(tls):
    roles = {n: certs.role_of(x509.load_pem_x509_certificate((tls / f"{n}.pem").read_bytes()))
             for n in ("controller", "ep1", "switch-00000000000c0de1")}
    assert roles == {"controller": certs.ROLE_CONTROLLER, "ep1": certs.ROLE_EP,
                     "switch-00000000000c0de1": certs.ROLE_SWITCH}


def test_a_switch_certificate_binds_its_datapath_id(tls):
    assert certs.switch_dpid(der(tls, "switch-00000000000c0de1")) == 0xC0DE1
    assert certs.switch_dpid(der(tls, "switch-0000000000000a01")) == 0xA01


@pytest.mark.parametrize("name,why", [("ep1", "role 'lark-ep', not 'lark-switch'"),
                                      ("controller", "role 'lark-controller', not 'lark-switch'")])
def test_other_roles_are_not_switches(tls, name, why):
    with pytest.raises(ValueError, match=why):
        certs.switch_dpid(der(tls, name))


def test_an_ep_named_like_a_switch_is_still_an_ep(tmp_path):
    certs.make(str(tmp_path), ["switch-00000000000c0de1"])
    with pytest.raises(ValueError, match="role 'lark-ep'"):
        certs.switch_dpid(der(tmp_path, "switch-00000000000c0de1"))


@pytest.mark.parametrize("text", ["", "0x", "xyz", "1" * 17, "12:zz"])
def test_a_bad_datapath_id_is_refused_with_the_fix(tmp_path, text):
    with pytest.raises(LarkError, match=r"not a datapath id.*16 hex digits"):
        certs.make(str(tmp_path), [f"switch:{text}"])


def openflow(**keys) -> dict:
    return {"openflow": keys}


def test_openflow_is_tls_unless_the_insecure_knob_is_set():
    assert from_mapping({}).insecure_plain_openflow is False
    assert from_mapping(openflow(tls=True)).insecure_plain_openflow is False
    assert from_mapping(openflow(insecure_plain_openflow=True)).insecure_plain_openflow is True
    assert from_mapping(openflow(tls=False, insecure_plain_openflow=True)).insecure_plain_openflow is True


@pytest.mark.parametrize("keys,why", [({"tls": False}, "act as the switch"),
                                      ({"tls": True, "insecure_plain_openflow": True}, "contradicts"),
                                      ({"insecure_plain_openflow": "yes"}, "true or false")])
def test_plain_openflow_without_the_knob_is_refused(keys, why):
    with pytest.raises(LarkError, match=why):
        from_mapping(openflow(**keys))
