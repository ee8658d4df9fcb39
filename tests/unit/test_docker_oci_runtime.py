"""lark-oci-runtime (lark/job/oci_runtime.py): runc create, then larkd's docker_setup; a refusal (or larkd away)
deletes what runc created and fails with Lark's reason; everything else is runc's own. The real runc is a fake
script here that logs its argv; larkd is absent or a fake socket that answers a refusal."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from lark import protocol
from lark.job import oci_runtime

CID = "b" * 64


@pytest.fixture
def runc(tmp_path, monkeypatch):
    """A fake runc: appends its argv to calls.txt; `create` writes a pid into --pid-file; exits $FAKE_RUNC_EXIT."""
    calls = tmp_path / "calls.txt"
    fake = tmp_path / "runc"
    fake.write_text(f"""#!/bin/sh
echo "$*" >> {calls}
while [ $# -gt 0 ]; do [ "$1" = --pid-file ] && echo {os.getpid()} > "$2"; shift; done
exit ${{FAKE_RUNC_EXIT:-0}}
""")
    fake.chmod(0o755)
    monkeypatch.setenv("LARK_REAL_RUNC", str(fake))
    monkeypatch.setattr(oci_runtime, "LARKD_WAIT_S", 0.3)
    return calls


def argv(tmp_path: Path) -> list[str]:
    return ["--root", "/run/r", "--log", str(tmp_path / "log.json"), "--log-format", "json", "create", "--bundle",
            str(tmp_path), "--pid-file", str(tmp_path / "init.pid"), CID]


def test_larkd_away_fails_the_create_and_deletes_the_container(runc, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("LARK_SOCKET", str(tmp_path / "no-larkd.sock"))
    assert oci_runtime.main(argv(tmp_path)) == oci_runtime.EXIT_REFUSED
    calls = runc.read_text().splitlines()
    assert calls[0].endswith(f"create --bundle {tmp_path} --pid-file {tmp_path}/init.pid {CID}")
    assert calls[1] == f"--root /run/r --log {tmp_path}/log.json --log-format json delete --force {CID}"
    err = capsys.readouterr().err
    assert "Lark: the docker job's network could not be set up" in err and "larkd is not running" in err, err
    logged = json.loads((tmp_path / "log.json").read_text().splitlines()[-1])   # what containerd reports
    assert logged["level"] == "error" and "larkd is not running" in logged["msg"]


def fake_larkd(path: str, answer: bytes, asked: list[dict]) -> socket.socket:
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(path)
    srv.listen(1)

    def serve() -> None:
        conn, _ = srv.accept()
        with conn:
            asked.append(json.loads(conn.makefile("rb").readline()))
            conn.sendall(answer)
    threading.Thread(target=serve, daemon=True).start()
    return srv


def test_a_refusal_by_larkd_is_the_reason_and_the_container_goes(runc, tmp_path, monkeypatch, capsys):
    sock = str(tmp_path / "larkd.sock")
    monkeypatch.setenv("LARK_SOCKET", sock)
    asked: list[dict] = []
    srv = fake_larkd(sock, protocol.error("job 12.3: the policy gives it no network"), asked)
    try:
        assert oci_runtime.main(argv(tmp_path)) == oci_runtime.EXIT_REFUSED
    finally:
        srv.close()
    assert asked[0]["op"] == "docker_setup" and asked[0]["container"] == CID and asked[0]["pid"] == os.getpid()
    assert runc.read_text().splitlines()[-1].endswith(f"delete --force {CID}")
    assert "job 12.3: the policy gives it no network" in capsys.readouterr().err


def test_a_ready_network_lets_the_create_succeed(runc, tmp_path, monkeypatch):
    sock = str(tmp_path / "larkd.sock")
    monkeypatch.setenv("LARK_SOCKET", sock)
    asked: list[dict] = []
    srv = fake_larkd(sock, protocol.ok(plan={"network_type": "nat", "ipv4": "10.213.0.2"}), asked)
    try:
        assert oci_runtime.main(argv(tmp_path)) == 0
    finally:
        srv.close()
    assert len(runc.read_text().splitlines()) == 1   # create only: nothing deleted


def test_a_failed_runc_create_is_runcs_own_failure(runc, tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_RUNC_EXIT", "3")
    monkeypatch.setenv("LARK_SOCKET", str(tmp_path / "no-larkd.sock"))
    assert oci_runtime.main(argv(tmp_path)) == 3
    assert len(runc.read_text().splitlines()) == 1   # larkd never asked, nothing deleted


def test_other_subcommands_are_runcs_own_exec(runc, tmp_path):
    """start/state/kill/delete: the runtime process becomes runc (exec), so its exit code is runc's."""
    env = dict(os.environ, FAKE_RUNC_EXIT="7")
    cp = subprocess.run([sys.executable, "-m", "lark.job.oci_runtime", "--root", "/run/r", "kill", CID, "9"],
                        env=env, capture_output=True, text=True)
    assert cp.returncode == 7, cp.stderr
    assert runc.read_text().splitlines() == [f"--root /run/r kill {CID} 9"]


def test_split_and_options():
    glob, sub, args = oci_runtime.split_command(["--root", "/r", "--systemd-cgroup", "create", "--bundle", "b", "x"])
    assert (glob, sub, args) == (["--root", "/r", "--systemd-cgroup"], "create", ["--bundle", "b", "x"])
    assert oci_runtime.option(["--pid-file=/p", "x"], "--pid-file") == "/p"
    assert oci_runtime.option(["-pid-file", "/q", "x"], "--pid-file") == "/q"
    assert oci_runtime.container_id(["--bundle", "b", "x"]) == "x"
