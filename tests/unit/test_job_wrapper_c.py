"""The compiled fast path of lark-job-wrapper (lark/job/launcher/job_wrapper.c) against a stand-in larkd socket.

It must speak the same bytes as lark/job/client.py, become the job on the common path (ok, no exit barrier),
refuse the way the Python wrapper refuses (same text, same exit code, same error file), and hand every other case
to the Python wrapper with the job's arguments: two builds, one whose fallback is a stub that records its call,
one whose fallback is the real Python wrapper.
"""
from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from lark import protocol

REPO = Path(__file__).resolve().parents[2]
SOURCE = REPO / "lark" / "job" / "launcher" / "job_wrapper.c"
CFLAGS = ["-O2", "-Wall", "-Wextra", "-Werror", "-fstack-protector-strong", "-D_FORTIFY_SOURCE=2", "-fPIE", "-pie"]
STUB_CODE = 99

pytestmark = pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc (the CI installs it)")


def build(dest: Path, fallback: Path) -> Path:
    out = dest / "lark-job-wrapper-fast"
    subprocess.run(["gcc", *CFLAGS, f"-DLARK_PY_WRAPPER=\"{fallback}\"", "-o", str(out), str(SOURCE)], check=True)
    return out


@pytest.fixture(scope="module")
def builds(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("jwc")
    stub = d / "stub-wrapper"
    # Records that the Python wrapper would have run, and with which arguments.
    stub.write_text(f'#!/bin/sh\nfor a in "$@"; do printf "%s\\n" "$a"; done > "$STUB_RECORD"\nexit {STUB_CODE}\n')
    stub.chmod(0o755)
    real = d / "lark-job-wrapper"
    # As pip writes the console script (no -I: PYTHON* variables count, PYTHONCOERCECLOCALE among them).
    real.write_text(f"#!{sys.executable}\nimport sys\nsys.path.insert(0, {str(REPO)!r})\n"
                    "from lark.job.wrapper import main\nsys.exit(main())\n")
    real.chmod(0o755)
    (d / "stub").mkdir()
    (d / "real").mkdir()
    return {"stub": build(d / "stub", stub), "real": build(d / "real", real), "python": real}


class FakeLarkd:
    """Records each request line as bytes; answers with `answer` (bytes), or keeps the connection open unanswered
    when it is None. A `push` gets ok."""

    def __init__(self, path: Path, answer: bytes | None):
        self.path, self.answer = path, answer
        self.requests: list[bytes] = []
        self.open: list[socket.socket] = []
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(str(path))
        self.sock.listen(8)
        threading.Thread(target=self.serve, daemon=True).start()

    def serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            line = conn.makefile("rb").readline()
            self.requests.append(line)
            if protocol.loads(line).get("op") == "push":
                conn.sendall(protocol.ok(pushed=True))
            elif self.answer is None:
                self.open.append(conn)
                continue
            else:
                conn.sendall(self.answer)
            conn.close()

    def ops(self) -> list[str]:
        return [str(protocol.loads(r)["op"]) for r in self.requests]

    def stop(self) -> None:
        self.sock.close()
        for c in self.open:
            c.close()
        self.path.unlink(missing_ok=True)


@pytest.fixture
def larkd(tmp_path):
    fakes: list[FakeLarkd] = []

    def make(answer: bytes | None) -> FakeLarkd:
        fakes.append(FakeLarkd(tmp_path / "lark.sock", answer))
        return fakes[-1]
    yield make
    for f in fakes:
        f.stop()


def run(prog: Path, tmp_path: Path, *job: str, env: dict | None = None, **kw) -> subprocess.CompletedProcess:
    base = {"PATH": os.environ["PATH"], "LARK_SOCKET": str(tmp_path / "lark.sock"),
            "STUB_RECORD": str(tmp_path / "stub-record"), "_CONDOR_WRAPPER_ERROR_FILE": str(tmp_path / "err")}
    return subprocess.run([str(prog), *job], env={**base, **(env or {})}, capture_output=True, text=True,
                          timeout=60, **kw)


def fell_back(tmp_path: Path, cp: subprocess.CompletedProcess, job: list[str]) -> bool:
    rec = tmp_path / "stub-record"
    if not rec.exists():
        return False
    assert cp.returncode == STUB_CODE, cp.stderr
    assert rec.read_text().splitlines() == job, "the Python wrapper must get the job's arguments unchanged"
    return True


OK_NO_BARRIER = protocol.ok(plan={"network_type": "nat", "ipv4": "10.0.0.2"},
                            env={"LARK_NETWORK_TYPE": "nat", "LARK_IPV4_ADDRESS": "10.0.0.2"}, exit_barrier=0.0)


def test_common_path_sends_the_clients_bytes_sets_env_and_becomes_the_job(tmp_path, larkd, builds):
    fake = larkd(OK_NO_BARRIER)
    # Started with SIGPIPE and SIGXFSZ ignored (restore_signals=False keeps Python's): the job gets the defaults.
    cp = run(builds["stub"], tmp_path, "sh", "-c", 'echo "$LARK_NETWORK_TYPE $LARK_IPV4_ADDRESS $$ $PPID"; '
             "grep SigIgn /proc/self/status; exit 5", restore_signals=False)
    assert not fell_back(tmp_path, cp, []), "the common path ran the Python wrapper"
    assert cp.returncode == 5, cp.stderr
    assert fake.requests == [protocol.request("setup")]
    first, sigign = cp.stdout.splitlines()
    assert first.split()[:2] == ["nat", "10.0.0.2"]
    ignored = int(sigign.split()[1], 16)
    assert not ignored & (1 << (signal.SIGPIPE - 1)) and not ignored & (1 << (signal.SIGXFSZ - 1)), sigign


@pytest.mark.parametrize("barrier", ["absent", 0, -1, False, "5", None])
def test_no_barrier_in_any_form_the_python_wrapper_reads_as_none(tmp_path, larkd, builds, barrier):
    fields: dict = {"plan": {}, "env": {"LARK_NETWORK_TYPE": "nat"}}
    if barrier != "absent":
        fields["exit_barrier"] = barrier
    larkd(protocol.ok(**fields))
    cp = run(builds["stub"], tmp_path, "sh", "-c", 'echo "$LARK_NETWORK_TYPE"')
    assert not fell_back(tmp_path, cp, [])
    assert cp.returncode == 0 and cp.stdout == "nat\n", cp.stderr


@pytest.mark.parametrize("locale_env", [{}, {"LANG": "C"}, {"LC_ALL": "C"}, {"LC_CTYPE": "C.UTF-8"},
                                        {"PYTHONCOERCECLOCALE": "0"}])
def test_the_job_gets_the_environment_the_python_wrapper_gives_it(tmp_path, larkd, builds, locale_env):
    """The same environment, variable for variable: the LARK_* ones, and the LC_CTYPE Python's start sets (PEP 538
    coercion of a C locale) that jobs run by the Python wrapper have always had."""
    larkd(OK_NO_BARRIER)
    envs = []
    for prog in (builds["stub"], builds["python"]):
        cp = run(prog, tmp_path, "env", "-0", env=locale_env)
        assert cp.returncode == 0 and not (tmp_path / "stub-record").exists(), cp.stderr
        envs.append(sorted(cp.stdout.split("\0")))
    assert envs[0] == envs[1]
    assert "LARK_NETWORK_TYPE=nat" in envs[0]


def test_escapes_decode_like_python(tmp_path, larkd, builds):
    value = 'a"b\\c/\u00e9\u20ac\U0001f600\t'
    larkd(protocol.ok(plan={}, env={"LARK_X": value}))
    cp = run(builds["stub"], tmp_path, sys.executable, "-c", "import os; print(ascii(os.environ['LARK_X']))")
    assert not fell_back(tmp_path, cp, [])
    assert cp.stdout.strip() == ascii(value), cp.stderr


@pytest.mark.parametrize("case", ["barrier", "barrier_true", "busy", "no_socket", "closed", "garbage", "array",
                                  "env_not_str", "env_key_eq", "env_nul", "nan_barrier", "ok_number", "non_ascii",
                                  "sshd", "flag", "toml", "timeout_env"])
def test_every_other_case_goes_to_the_python_wrapper(tmp_path, larkd, builds, case):
    answers = {
        "barrier": protocol.ok(plan={}, env={}, exit_barrier=20.0),
        "barrier_true": protocol.ok(plan={}, env={}, exit_barrier=True),
        "busy": protocol.error("too many connections", busy=True),
        "closed": b"",
        "garbage": b"{\"lark\":1,\"ok\":tru}\n",
        "array": b"[1]\n",
        "env_not_str": protocol.ok(env={"A": 1}),
        "env_key_eq": protocol.ok(env={"A=B": "x"}),
        "env_nul": protocol.ok(env={"A": "x\u0000y"}),
        "nan_barrier": b"{\"lark\":1,\"ok\":true,\"env\":{},\"exit_barrier\":NaN}\n",
        "ok_number": b"{\"lark\":1,\"ok\":1,\"env\":{}}\n",
        "non_ascii": "{\"lark\":1,\"ok\":true,\"env\":{\"A\":\"\u00e9\"}}\n".encode(),
    }
    env: dict = {}
    job = ["sh", "-c", "echo ran"]
    if case == "sshd":
        job = ["/usr/sbin/sshd", "-i", "-e", "-f", "/scratch/.condor_ssh_to_job_1/sshd_config"]
    elif case == "flag":
        job = ["--help"]
    elif case == "toml":
        (tmp_path / "lark.toml").write_text('[daemon]\nsocket = "/elsewhere"\n')
        env = {"LARK_SOCKET": "", "LARK_CONFIG": str(tmp_path / "lark.toml")}
    elif case == "timeout_env":
        env = {"LARK_WRAPPER_TIMEOUT": "1e1"}
    if case not in ("no_socket",):
        larkd(answers.get(case, OK_NO_BARRIER))
    cp = run(builds["stub"], tmp_path, *job, env=env)
    assert fell_back(tmp_path, cp, job), f"{case}: the fast path handled it (rc {cp.returncode}): {cp.stdout}"
    assert "ran" not in cp.stdout


def test_no_arguments_go_to_the_python_wrapper(tmp_path, builds):
    cp = run(builds["stub"], tmp_path)
    assert fell_back(tmp_path, cp, [])


def same_as_python(tmp_path: Path, builds: dict, job: list[str], env: dict | None = None) -> tuple:
    """Runs the fast path and the Python wrapper on the same answer: (exit code, stderr, error file) of each."""
    got = []
    for prog in (builds["stub"], builds["python"]):
        (tmp_path / "err").unlink(missing_ok=True)
        cp = run(prog, tmp_path, *job, env=env)
        assert not (tmp_path / "stub-record").exists(), "the fast path fell back instead of refusing"
        err_file = (tmp_path / "err").read_text() if (tmp_path / "err").exists() else None
        got.append((cp.returncode, cp.stderr, err_file))
    return tuple(got)


def test_a_refusal_is_the_python_wrappers_refusal(tmp_path, larkd, builds):
    fake = larkd(protocol.error("job 12.0: slot1_1: no address left in pool nat (widen the pool)"))
    fast, python = same_as_python(tmp_path, builds, ["sh", "-c", "echo ran"])
    assert fast == python
    assert fast[0] == 111 and "no address left" in fast[1] and fast[2] == fast[1]
    assert fake.ops() == ["setup", "setup"], "each wrapper asked once"


def test_an_error_without_text_reads_unknown_error(tmp_path, larkd, builds):
    larkd(b"{\"lark\":1,\"ok\":false}\n")
    fast, python = same_as_python(tmp_path, builds, ["true"])
    assert fast == python and "larkd: unknown error" in fast[1]


@pytest.mark.parametrize("what", ["missing", "not_executable", "no_shebang", "directory_in_path"])
def test_a_program_that_cannot_be_executed_is_refused_like_python(tmp_path, larkd, builds, what):
    larkd(OK_NO_BARRIER)
    env = None
    if what == "missing":
        job = [str(tmp_path / "no-such-program")]
    elif what == "not_executable":
        (tmp_path / "prog").write_text("#!/bin/sh\necho ran\n")
        job = [str(tmp_path / "prog")]
    elif what == "no_shebang":  # glibc's execvp would run it with /bin/sh; Python's os.execvp does not
        (tmp_path / "prog").write_text("echo ran\n")
        (tmp_path / "prog").chmod(0o755)
        job = [str(tmp_path / "prog")]
    else:  # searched in PATH: a non-executable hit is remembered, a later miss does not hide it
        (tmp_path / "bin").mkdir()
        (tmp_path / "bin" / "lark-test-prog").write_text("#!/bin/sh\necho ran\n")
        env = {"PATH": f"{tmp_path}/bin:/nonexistent"}
        job = ["lark-test-prog"]
    fast, python = same_as_python(tmp_path, builds, job, env)
    assert fast == python
    assert fast[0] == 111 and "cannot execute" in fast[1], fast


def test_no_answer_within_the_timeout_is_refused_like_python(tmp_path, larkd, builds):
    fake = larkd(None)
    fast, python = same_as_python(tmp_path, builds, ["true"], {"LARK_WRAPPER_TIMEOUT": "0.3"})
    assert fast == python
    assert fast[0] == 111 and "did not answer within 0.3 s" in fast[1], fast
    assert fake.ops() == ["setup", "setup"]


def test_a_held_job_waits_to_be_vacated(tmp_path, larkd, builds):
    larkd(protocol.error("no address left", held=True))
    p = subprocess.Popen([str(builds["stub"]), "true"], env={"LARK_SOCKET": str(tmp_path / "lark.sock")},
                         stderr=subprocess.PIPE, text=True)
    try:
        with pytest.raises(subprocess.TimeoutExpired):
            p.wait(timeout=1.5)
    finally:
        p.kill()
        _, err = p.communicate()
    assert "larkd: no address left" in err


def test_a_barrier_runs_the_real_python_wrapper_which_asks_again_and_pushes_at_the_end(tmp_path, larkd, builds):
    fake = larkd(protocol.ok(plan={}, env={"LARK_NETWORK_TYPE": "nat"}, exit_barrier=5.0))
    cp = run(builds["real"], tmp_path, "sh", "-c", 'echo "$LARK_NETWORK_TYPE"; exit 3')
    assert cp.returncode == 3, cp.stderr
    assert cp.stdout == "nat\n"
    assert fake.ops() == ["setup", "setup", "push"], fake.requests
