"""The compiled lark-starter (lark/job/launcher/starter.c) against the Python one (lark/job/starter_wrapper.py).

Both run, one after the other, with the same environment, the same stand-in larkd socket and the same stand-in
real starter (a shell script that prints its argv, its environment and its ignored signals): the compiled one must
send larkd the same bytes, write the same stderr line where it fails open, and leave the real starter the same
arguments, environment and signal dispositions; `-classad` and the odd cases run the Python one. Then `lark
install-hook`'s step for it: root:root 0755, or a symlink to the Python one where it cannot be compiled.
"""
from __future__ import annotations

import logging
import os
import shutil
import socket
import stat
import subprocess
import sys
from pathlib import Path

import pytest

# The compiled job wrapper's stand-in larkd: records each request line, answers `answer` or holds the connection.
from test_job_wrapper_c import FakeLarkd as Larkd

from lark import hook_launcher, protocol
from lark.job import starter_wrapper

REPO = Path(__file__).resolve().parents[2]
SLOT_ARGS = ["-f", "-local-name", "x", "-a", "slot1_2", "<127.0.0.1:9618?addrs=127.0.0.1-9618&alias=ep>"]

needs_gcc = pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc (the CI installs it)")


@pytest.fixture(scope="module")
def progs(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("starter_c")
    os.chmod(d, 0o755)
    real = d / "condor_starter"
    # What the real starter would see: its arguments, its environment, its ignored signals (the shell's own,
    # read without a child: a child's would be the same, but not if the shell changed them).
    real.write_text('#!/bin/sh\nfor a in "$0" "$@"; do printf "argv %s\\n" "$a"; done\nenv | sort | sed "s/^/env /"\n'
                    'while read -r k v; do [ "$k" = SigIgn: ] && echo "sigign $v"; done < /proc/$$/status\n'
                    'case " $* " in *" -classad "*) echo "HasJobNetworking = True"; exit 0;; esac\nexit 7\n')
    real.chmod(0o755)
    py = d / "lark-starter-py"
    # As pip writes the console script (no -I).
    py.write_text(f"#!{sys.executable}\nimport sys\nsys.path.insert(0, {str(REPO)!r})\n"
                  "from lark.job.starter_wrapper import main\nsys.exit(main())\n")
    py.chmod(0o755)
    progs = {"real": real, "py": py}
    if shutil.which("gcc"):
        c = d / "lark-starter"
        subprocess.run(["gcc", *hook_launcher.CFLAGS, f"-DLARK_PY_STARTER=\"{py}\"",
                        f"-DLARK_REAL_STARTER_PATH=\"{real}\"", "-o", str(c), str(hook_launcher.STARTER_SOURCE)],
                       check=True)
        progs["c"] = c
    return progs


@pytest.fixture
def sock(tmp_path):
    path = tmp_path / "lark.sock"
    made: list[Larkd] = []

    def serve(answer: bytes | None) -> Larkd:
        made.append(Larkd(path, answer))
        return made[-1]
    yield path, serve
    for fake in made:
        fake.stop()


def run(prog: Path, args: list[str], sock: Path, **env: str) -> tuple[int, list[str], list[str]]:
    base = {"PATH": os.environ["PATH"], "LARK_SOCKET": str(sock), "LARK_CONFIG": str(sock) + ".no-toml"}
    cp = subprocess.run([str(prog), *args], env={**base, **env}, capture_output=True, text=True, timeout=60)
    return cp.returncode, cp.stdout.splitlines(), cp.stderr.splitlines()


def both(progs: dict[str, Path], args: list[str], sock: Path, fake: Larkd | None = None, **env: str):
    """The Python and the compiled starter's (exit code, stdout, stderr), and what larkd got from each."""
    env.setdefault("LARK_REAL_STARTER", str(progs["real"]))
    out = []
    for name in ("py", "c"):
        before = len(fake.requests) if fake else 0
        code, stdout, stderr = run(progs[name], args, sock, **env)
        out.append(((code, stdout, stderr), fake.requests[before:] if fake else []))
    return out


def starts_real(progs, result, args: list[str]) -> None:
    code, stdout, _ = result
    assert code == 7, result
    assert [line for line in stdout if line.startswith("argv ")] == [f"argv {a}" for a in [str(progs["real"]), *args]]
    assert "env _CONDOR_NO_JOB_NETWORKING=true" in stdout


@needs_gcc
def test_ask_ok_same_request_bytes_and_same_start_of_the_real_starter(progs, sock):
    path, serve = sock
    fake = serve(protocol.ok(limited=True, cgroup="/sys/fs/cgroup/unified/lark.sandbox/starter-1-2"))
    args = [*SLOT_ARGS, 'odd "quoted" \\ tab\t del\x7f bell\x07']
    (py, py_req), (c, c_req) = both(progs, args, path, fake)
    assert py_req == [protocol.request("sandbox_limit", slot="slot1_2", argv=args)]
    assert c_req == py_req   # byte for byte
    starts_real(progs, c, args)
    assert c == py   # arguments, environment (LC_CTYPE coerced alike), ignored signals, no stderr
    assert c[2] == [] and any(line.startswith("env LC_CTYPE=") for line in c[1])


@needs_gcc
@pytest.mark.parametrize("answer, said", [
    (protocol.error("sandbox limit: no cgroup v2 mount"), "larkd: sandbox limit: no cgroup v2 mount"),
    (protocol.encode({"ok": False}), "larkd: unknown error"),
    (protocol.encode({"ok": False, "busy": True}), "larkd: busy (retry in a moment)"),
    (protocol.encode({"ok": 0, "busy": 1, "error": "too many connections"}),
     "larkd: too many connections (retry in a moment)"),
    (b"", "larkd closed the connection without answering (check larkd's log)"),
])
def test_refusals_give_the_same_line_and_the_starter_starts_anyway(progs, sock, answer, said):
    path, serve = sock
    fake = serve(answer)
    (py, py_req), (c, c_req) = both(progs, SLOT_ARGS, path, fake)
    assert len(c_req) == 1 and c_req == py_req, "asked once each"
    starts_real(progs, c, SLOT_ARGS)
    assert c[2] == [f"lark-starter: slot slot1_2: sandbox transfer not limited to the slot's Bandwidth, the starter "
                    f"starts anyway: {'' if said.startswith('larkd:') else str(path) + ': '}{said}"]
    assert c == py


@needs_gcc
@pytest.mark.parametrize("how", ["no_socket", "refused"])
def test_larkd_away_same_line(progs, sock, how):
    path, _ = sock
    if how == "refused":   # a socket file nobody listens on
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.bind(str(path))
    py, c = both(progs, SLOT_ARGS, path)
    starts_real(progs, c[0], SLOT_ARGS)
    why = "no socket" if how == "no_socket" else "connection refused"
    assert c[0][2] == [f"lark-starter: slot slot1_2: sandbox transfer not limited to the slot's Bandwidth, the "
                       f"starter starts anyway: {path}: larkd is not running ({why}) (start larkd: condor_on -daemon "
                       "LARKD, or systemctl start larkd)"]
    assert c == py


@needs_gcc
def test_silent_larkd_same_timeout_and_line(progs, sock):
    path, serve = sock
    fake = serve(None)
    (py, _), (c, c_req) = both(progs, SLOT_ARGS, path, fake)
    assert len(c_req) == 1
    starts_real(progs, c, SLOT_ARGS)
    assert c[2] == [f"lark-starter: slot slot1_2: sandbox transfer not limited to the slot's Bandwidth, the starter "
                    f"starts anyway: {path}: larkd did not answer within 5 s (check larkd's log)"]
    assert c == py


@needs_gcc
@pytest.mark.parametrize("args, env", [
    (SLOT_ARGS, {"LARK_SANDBOX_LIMIT": " Off\n"}),
    (SLOT_ARGS, {"LARK_SANDBOX_LIMIT": "FALSE"}),
    (["-version"], {}),
    (["-f", "-a"], {}),   # -a last: no slot
])
def test_no_question_without_a_slot_or_when_told_not_to(progs, sock, args, env):
    path, serve = sock
    fake = serve(protocol.ok(limited=True))
    (py, py_req), (c, c_req) = both(progs, args, path, fake, **env)
    assert py_req == c_req == []
    starts_real(progs, c, args)
    assert c == py


@needs_gcc
def test_a_sandbox_limit_knob_not_off_asks(progs, sock):
    path, serve = sock
    fake = serve(protocol.ok(limited=True))
    (py, py_req), (c, c_req) = both(progs, SLOT_ARGS, path, fake, LARK_SANDBOX_LIMIT="offf")
    assert len(c_req) == 1 and c_req == py_req and c == py


@needs_gcc
def test_classad_is_the_python_ones_with_the_compiled_in_real_starter(progs, sock):
    path, _ = sock
    # No LARK_REAL_STARTER in the environment: the compiled one passes the one built in (the Python one alone
    # would ask condor_config_val).
    code, stdout, stderr = run(progs["c"], ["-classad"], path)
    assert code == 0, stderr
    assert f"argv {progs['real']}" in stdout and "HasJobNetworking = True" in stdout
    assert "env _CONDOR_NO_JOB_NETWORKING=true" not in stdout, "-classad must keep HasJobNetworking"
    assert [line.split(" = ")[0] for line in stdout if line.startswith("Lark")] == ["LarkVersion", "LarkNetworkTypes"]
    (py, _), (c, _) = both(progs, ["-classad"], path)
    assert c == py


@needs_gcc
def test_odd_cases_go_to_the_python_one(progs, sock, tmp_path):
    path, serve = sock
    rec = tmp_path / "fallback-args"
    stub = tmp_path / "stub"
    stub.write_text(f'#!/bin/sh\nprintf "%s\\n" "$LARK_REAL_STARTER" "$@" > {rec}\nexit 9\n')
    stub.chmod(0o755)
    c = tmp_path / "lark-starter"
    subprocess.run(["gcc", *hook_launcher.CFLAGS, f"-DLARK_PY_STARTER=\"{stub}\"",
                    f"-DLARK_REAL_STARTER_PATH=\"{progs['real']}\"", "-o", str(c),
                    str(hook_launcher.STARTER_SOURCE)], check=True)
    fake = serve(b'{"ok": NaN}\n')
    for args, env in ((["-classad"], {}), ([*SLOT_ARGS, "caf\u00e9"], {}), (SLOT_ARGS, {}),
                      (SLOT_ARGS, {"LARK_SOCKET": "", "LARK_CONFIG": str(stub)})):
        rec.unlink(missing_ok=True)
        code, _, stderr = run(c, args, path, **env)
        assert code == 9, (args, env, stderr)
        assert rec.read_text().splitlines() == [str(progs["real"]), *args]
    assert len(fake.requests) == 1, "only the odd answer was asked before handing over"
    # And with an answer it reads, the compiled one does not hand over: the stand-in starter runs.
    fake.answer = protocol.error("refused")
    rec.unlink()
    code, _, _ = run(c, SLOT_ARGS, path)
    assert code == 7 and not rec.exists()


# -- lark install-hook ---------------------------------------------------------------------------------------------
needs_root_and_gcc = pytest.mark.skipif(os.geteuid() != 0 or shutil.which("gcc") is None,
                                        reason="installs root-owned files and compiles with gcc")


def test_the_default_real_starter_is_the_python_ones():
    assert hook_launcher.DEFAULT_REAL_STARTER == starter_wrapper.DEFAULT_REAL


@needs_root_and_gcc
def test_install_compiled_root_0755_and_runs_the_real_starter_named_at_install(progs, tmp_path, sock):
    path, serve = sock
    os.chmod(tmp_path, 0o755)
    dest = tmp_path / "libexec" / "lark-starter"
    assert hook_launcher.install_starter(dest, progs["py"], progs["real"]) is True
    st = os.lstat(dest)
    assert stat.S_ISREG(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o755 and (st.st_uid, st.st_gid) == (0, 0)
    assert dest.read_bytes()[:4] == b"\x7fELF"
    fake = serve(protocol.ok(limited=True))
    code, stdout, stderr = run(dest, SLOT_ARGS, path)   # no LARK_REAL_STARTER: the one named at install
    assert code == 7 and stderr == [] and stdout[0] == f"argv {progs['real']}"
    assert fake.requests == [protocol.request("sandbox_limit", slot="slot1_2", argv=SLOT_ARGS)]


@needs_root_and_gcc
@pytest.mark.parametrize("how", ["no_cc", "cc_fails", "asked"])
def test_without_a_compiler_the_python_starter_stays_and_says_why(progs, tmp_path, caplog, how):
    os.chmod(tmp_path, 0o755)
    dest = tmp_path / "libexec" / "lark-starter"
    assert hook_launcher.install_starter(dest, progs["py"], progs["real"]) is True   # replaced too
    cc = {"no_cc": "lark-no-such-cc", "cc_fails": "false", "asked": "gcc"}[how]
    with caplog.at_level(logging.WARNING, logger="lark.hook_launcher"):
        assert hook_launcher.install_starter(dest, progs["py"], progs["real"], cc=cc, compiled=how != "asked") is False
    assert dest.is_symlink() and os.readlink(dest) == str(progs["py"])
    assert {"no_cc": "no C compiler 'lark-no-such-cc'", "cc_fails": "false failed",
            "asked": "--python-starter"}[how] in caplog.text
    assert not list(dest.parent.glob(".lark-starter.*")), "a temporary file was left"


def test_paths_that_cannot_be_compiled_in_are_refused(progs, tmp_path):
    with pytest.raises(Exception, match="absolute path"):
        hook_launcher.install_starter(tmp_path / "lark-starter", progs["py"], Path('/usr/sbin/condor"starter'))
