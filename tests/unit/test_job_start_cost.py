"""The job's side starts fast (issue 15): the wrapper's imports and the protocol's C JSON codec."""
from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from lark import config, protocol
from lark.job import client

REPO = Path(__file__).resolve().parents[2]

SAMPLES = [
    {"lark": 1, "op": "setup"},
    {"lark": 1, "ok": True, "plan": {"ipv4": "10.213.0.2", "rate_limit_mbit": 12.5, "inbound": False,
                                     "dns": None, "ports": [1, 2, 3]}, "env": {"LARK_NETWORK_TYPE": "nat"}},
    {"text": "é, \u2603, tab\t, quote \" and backslash \\ and a \x01 control"},
    [], {}, "x", 0, -7, 10**30, 1e300, 1.5e-7, True, None,
]


@pytest.mark.parametrize("obj", SAMPLES)
def test_dumps_is_json_dumps_byte_for_byte(obj):
    assert protocol.dumps(obj) == json.dumps(obj, separators=(",", ":"))


@pytest.mark.parametrize("obj", SAMPLES)
def test_loads_reads_what_json_writes(obj):
    for text in (json.dumps(obj), json.dumps(obj, indent=2), " \n" + json.dumps(obj) + "\n"):
        assert protocol.loads(text.encode()) == obj
        assert protocol.loads(text) == obj


def test_loads_reads_json_constants_like_json():
    got = protocol.loads(b'{"a": NaN, "b": Infinity, "c": -Infinity}')
    assert math.isnan(got["a"]) and got["b"] == math.inf and got["c"] == -math.inf


@pytest.mark.parametrize("bad", [b"", b"   ", b"{", b'{"a": 1} x', b"[1,]", b"{'a': 1}", b"\xff", b"nul"])
def test_loads_refuses_what_json_refuses(bad):
    with pytest.raises(ValueError):
        json.loads(bad)
    with pytest.raises(ValueError):
        protocol.loads(bad)


def test_dumps_refuses_what_json_cannot_write():
    with pytest.raises(TypeError, match="set"):
        protocol.dumps({"a": {1, 2}})


def test_client_knows_where_the_config_file_is():
    # The client checks for the file without importing lark.config (the job's start): same path.
    assert client.CONFIG_FILE == config.DEFAULT_PATH


def test_wrapper_imports_nothing_slow():
    """json (-> re -> enum), socket (-> enum, selectors), random and the configuration code cost the job's start
    ~20 ms together; none of them is imported on the wrapper's way to the socket."""
    slow = ["json", "re", "enum", "socket", "selectors", "random", "lark.config", "dataclasses"]
    code = (f"import sys; sys.path.insert(0, {str(REPO)!r}); import lark.job.wrapper; "
            f"print(','.join(m for m in {slow!r} if m in sys.modules))")
    cp = subprocess.run([sys.executable, "-I", "-S", "-c", code], capture_output=True, text=True, check=True)
    assert cp.stdout.strip() == ""


def test_socket_path_without_a_config_file_needs_no_config_code(monkeypatch, tmp_path):
    monkeypatch.delenv("LARK_SOCKET", raising=False)
    monkeypatch.delenv("LARK_CONFIG", raising=False)
    monkeypatch.setattr(client, "CONFIG_FILE", str(tmp_path / "absent.toml"))
    assert client.socket_path() == client.DEFAULT_SOCKET
    cfg = tmp_path / "lark.toml"
    cfg.write_text('[daemon]\nsocket = "/run/elsewhere/lark.sock"\n')
    monkeypatch.setenv("LARK_CONFIG", str(cfg))
    assert client.socket_path() == "/run/elsewhere/lark.sock"
    # A file that is not TOML, or none at $LARK_CONFIG: larkd's default socket (as lark.config refuses them).
    cfg.write_text('[daemon]\nsocket = "/run/elsewhere/lark.sock\n')
    assert client.socket_path() == client.DEFAULT_SOCKET
    monkeypatch.setenv("LARK_CONFIG", str(tmp_path / "absent.toml"))
    assert client.socket_path() == client.DEFAULT_SOCKET
