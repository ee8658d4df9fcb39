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
import time
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

    def __init__(self, path: Path, answer: bytes | None, marker: Path | None = None,
                 push_answers: list[bytes] | None = None):
        self.path, self.answer, self.marker = path, answer, marker
        self.push_answers = list(push_answers or [])  # answered in turn to the pushes, then ok(pushed=True)
        self.pushed_after_job: list[bool] = []  # per push: whether the job's marker file existed
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
                self.pushed_after_job.append(bool(self.marker and self.marker.exists()))
                conn.sendall(self.push_answers.pop(0) if self.push_answers else protocol.ok(pushed=True))
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

    def make(answer: bytes | None, **kw) -> FakeLarkd:
        fakes.append(FakeLarkd(tmp_path / "lark.sock", answer, **kw))
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


@pytest.mark.parametrize("case", ["busy", "no_socket", "closed", "garbage", "array",
                                  "env_not_str", "env_key_eq", "env_nul", "nan_barrier", "ok_number", "non_ascii",
                                  "sshd", "flag", "toml", "timeout_env"])
def test_every_other_case_goes_to_the_python_wrapper(tmp_path, larkd, builds, case):
    answers = {
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


# -- the exit barrier: what lark/job/wrapper.py does (tests/unit/test_wrapper_barrier.py), compared with it ------

BARRIER = protocol.ok(plan={}, env={"LARK_NETWORK_TYPE": "nat"}, exit_barrier=5.0)
PUSH = protocol.request("push", barrier=True)


def start(prog: Path, tmp_path: Path, *job: str, env: dict | None = None) -> subprocess.Popen:
    base = {"PATH": os.environ["PATH"], "LARK_SOCKET": str(tmp_path / "lark.sock"),
            "STUB_RECORD": str(tmp_path / "stub-record")}
    return subprocess.Popen([str(prog), *job], env={**base, **(env or {})}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def test_the_push_comes_after_the_program_ended_and_the_wrapper_ends_with_its_code(tmp_path, larkd, builds):
    fake = larkd(BARRIER, marker=tmp_path / "done")
    cp = run(builds["stub"], tmp_path, "sh", "-c", f'echo "$LARK_NETWORK_TYPE $$"; sleep 0.3; touch {tmp_path}/done; '
             "exit 7")
    assert not fell_back(tmp_path, cp, []), "the barrier went to the Python wrapper"
    assert cp.returncode == 7, cp.stderr
    assert fake.requests == [protocol.request("setup"), PUSH], "not the Python wrapper's bytes"
    assert fake.pushed_after_job == [True], "the barrier's push came before the job's program had ended"
    net, _ = cp.stdout.split()
    assert net == "nat" and cp.stderr == ""


def test_barrier_true_is_a_barrier_as_in_python(tmp_path, larkd, builds):
    fake = larkd(protocol.ok(plan={}, env={}, exit_barrier=True), marker=tmp_path / "done")
    cp = run(builds["stub"], tmp_path, "sh", "-c", f"touch {tmp_path}/done")
    assert not fell_back(tmp_path, cp, []) and cp.returncode == 0, cp.stderr
    assert fake.ops() == ["setup", "push"] and fake.pushed_after_job == [True]


def wait_for(path: Path, p: subprocess.Popen) -> None:
    deadline = time.monotonic() + 20
    while not path.exists():
        assert time.monotonic() < deadline and p.poll() is None, p.communicate()
        time.sleep(0.02)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGUSR2, signal.SIGHUP])
def test_the_starters_signal_reaches_the_program(tmp_path, larkd, builds, sig):
    fake = larkd(BARRIER, marker=tmp_path / "done")
    ready = tmp_path / "ready"
    p = start(builds["stub"], tmp_path, "sh", "-c", f'trap "touch {tmp_path}/done; exit 42" {sig.name[3:]}; '
              f"touch {ready}; while :; do sleep 0.05; done")
    wait_for(ready, p)
    p.send_signal(sig)
    _, err = p.communicate(timeout=30)
    assert p.returncode == 42, err
    assert fake.pushed_after_job == [True]


def test_a_signal_before_the_program_runs_reaches_it(tmp_path, larkd, builds):
    """The starter's signal while the wrapper forks waits and is passed on (the Python wrapper's `pending`)."""
    larkd(BARRIER)
    p = start(builds["stub"], tmp_path, "sleep", "30")
    time.sleep(0.05)
    p.send_signal(signal.SIGTERM)
    p.communicate(timeout=30)
    assert p.returncode == -signal.SIGTERM


@pytest.mark.parametrize("sig", [signal.SIGUSR1, signal.SIGSEGV, signal.SIGKILL])
def test_a_program_killed_by_a_signal_makes_the_wrapper_end_by_the_same_signal(tmp_path, larkd, builds, sig):
    fake = larkd(BARRIER, marker=tmp_path / "done")
    p = start(builds["stub"], tmp_path, "sh", "-c", f"touch {tmp_path}/done; ulimit -c 0; kill -{sig.name[3:]} $$")
    _, err = p.communicate(timeout=30)
    assert p.returncode == -sig, err
    assert fake.pushed_after_job == [True]
    assert not list(tmp_path.glob("core*"))


def test_the_programs_signal_state_is_the_python_wrappers(tmp_path, larkd, builds):
    """Ignored, blocked, caught: the program starts as under the Python wrapper (SIGPIPE, SIGXFSZ default)."""
    larkd(BARRIER)
    got = []
    for prog in (builds["stub"], builds["python"]):
        p = start(prog, tmp_path, "grep", "^Sig[IBC]", "/proc/self/status")
        out, err = p.communicate(timeout=30)
        assert p.returncode == 0, err
        got.append(out)
    assert got[0] == got[1]
    ignored = int(got[0].split("SigIgn:")[1].split()[0], 16)
    assert not ignored & (1 << (signal.SIGPIPE - 1)) and not ignored & (1 << (signal.SIGXFSZ - 1)), got[0]


def test_a_program_that_cannot_be_executed_fails_like_python_and_no_push(tmp_path, larkd, builds):
    fake = larkd(BARRIER)
    fast, python = same_as_python(tmp_path, builds, [str(tmp_path / "no-such-program")])
    assert fast == python
    assert fast[0] == 111 and "cannot execute" in fast[1] and "No such file" in fast[1]
    assert fake.ops() == ["setup", "setup"], "a push for a job that never ran"


def test_the_barrier_waits_for_a_restarting_larkd(tmp_path, larkd, builds):
    fake = larkd(BARRIER, marker=tmp_path / "done")
    p = start(builds["stub"], tmp_path, "sh", "-c", f"sleep 0.5; touch {tmp_path}/done")
    time.sleep(0.3)
    fake.stop()
    wait_for(tmp_path / "done", p)
    time.sleep(1.5)
    assert p.poll() is None, "the wrapper left without waiting for larkd"
    back = larkd(BARRIER, marker=tmp_path / "done")
    _, err = p.communicate(timeout=30)
    assert p.returncode == 0, err
    assert back.ops() == ["push"] and back.pushed_after_job == [True] and err == ""


def test_a_busy_larkd_is_asked_again(tmp_path, larkd, builds):
    fake = larkd(BARRIER, push_answers=[protocol.error("too many connections", busy=True)] * 2)
    cp = run(builds["stub"], tmp_path, "true")
    assert cp.returncode == 0 and cp.stderr == ""
    assert fake.ops() == ["setup", "push", "push", "push"]


@pytest.mark.parametrize("answer", [
    protocol.ok(pushed=False, reason="no schedd push for this job (ad_source or push interval)"),
    protocol.ok(pushed=True, reason="not said when pushed"),
    protocol.error("job 3.0: pin lost"),
    protocol.error("too many connections", busy=True),
    b"{\"lark\":1,\"ok\":false}\n",
    b"not json\n",
])
def test_what_the_push_answers_is_said_as_python_says_it(tmp_path, builds, answer):
    """Both wrappers against the same larkd: the same exit code and the same lines (barrier 0.5 s for busy)."""
    got = []
    for prog in (builds["stub"], builds["python"]):
        fake = FakeLarkd(tmp_path / "lark.sock", protocol.ok(plan={}, env={}, exit_barrier=0.5),
                         push_answers=[answer] * 20)
        try:
            cp = run(prog, tmp_path, "sh", "-c", "exit 4")
        finally:
            fake.stop()
        assert not (tmp_path / "stub-record").exists()
        got.append((cp.returncode, cp.stderr))
    assert got[0] == got[1]
    assert got[0][0] == 4
    assert (got[0][1] == "") == (b"not said" in answer)


def test_past_the_bound_the_job_ends_with_its_code_and_says_why_as_python(tmp_path, larkd, builds):
    got = []
    for prog in (builds["stub"], builds["python"]):
        fake = larkd(protocol.ok(plan={}, env={}, exit_barrier=1.0))
        p = start(prog, tmp_path, "sh", "-c", "sleep 0.5; exit 3")
        time.sleep(0.2)
        fake.stop()
        _, err = p.communicate(timeout=30)
        got.append((p.returncode, err))
    assert got[0] == got[1]
    assert got[0][0] == 3 and "final network figures were not written" in got[0][1]
    assert "larkd is not running" in got[0][1]


def test_a_signal_during_the_barrier_has_its_default_effect(tmp_path, larkd, builds):
    """After the program ended, condor_rm's SIGTERM is for the wrapper itself (Forwarder.stop)."""
    fake = larkd(BARRIER, marker=tmp_path / "done")
    p = start(builds["stub"], tmp_path, "sh", "-c", f"sleep 0.3; touch {tmp_path}/done")
    time.sleep(0.1)
    fake.stop()  # the barrier waits for larkd
    wait_for(tmp_path / "done", p)
    time.sleep(0.5)
    assert p.poll() is None
    p.send_signal(signal.SIGTERM)
    p.communicate(timeout=30)
    assert p.returncode == -signal.SIGTERM


def test_a_barrier_with_the_real_python_fallback_stays_in_c(tmp_path, larkd, builds):
    fake = larkd(protocol.ok(plan={}, env={"LARK_NETWORK_TYPE": "nat"}, exit_barrier=5.0))
    cp = run(builds["real"], tmp_path, "sh", "-c", 'echo "$LARK_NETWORK_TYPE"; exit 3')
    assert cp.returncode == 3, cp.stderr
    assert cp.stdout == "nat\n"
    assert fake.ops() == ["setup", "push"], fake.requests
