"""The compiled PREPARE_JOB hook (lark/job/launcher/prepare_job.c) against the Python one (lark/job/prepare_hook.py).

Both run, one after the other, against the same stand-in larkd socket with the same environment and the same job ad
on stdin: the compiled one must send larkd the same bytes, print the same hold ad byte for byte (or nothing) and
exit with the same code, and hand every case it cannot reproduce exactly to the Python hook with the same stdin.
The compiled hook is built as `lark install-hook` builds it (hook_launcher.CFLAGS) and made setgid to a gid no
group has, as the real launcher is; a second build names an interpreter that does not exist, to show which cases
never need the Python hook.

Not covered: a larkd that accepts and never answers. The Python hook's timeout (30 s) has no knob, so the case
would take a minute per run; prepare_job.c's text for it is larkd_client.h's describe_outcome, shared with the job
wrapper, whose own test covers it with a short LARK_WRAPPER_TIMEOUT.
"""
from __future__ import annotations

import grp
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from test_job_wrapper_c import FakeLarkd

from lark import hook_launcher, protocol

REPO = Path(__file__).resolve().parents[2]
AD = 'MyType = "Job"\nClusterId = 12\nProcId = 0\nOwner = "alice"\nCmd = "/bin/true"\n'
AWAY_FIX = ("usually transient: condor_master restarts larkd and the job is released again automatically; if it "
            "stays held, check the execution point's LarkdLog and condor_on -daemon LARKD")
# The Python hook as the launcher runs it (`python -I script`), with its stdin also copied to $AD_COPY when set:
# the test's way to see what the hook read.
HOOK_SCRIPT = (f"import io, os, sys\nsys.path.insert(0, {str(REPO)!r})\n"
               "data = sys.stdin.read()\n"
               "if os.environ.get('AD_COPY'):\n"
               "    with open(os.environ['AD_COPY'], 'w', encoding='utf-8') as f: f.write(data)\n"
               "sys.stdin = io.StringIO(data)\n"
               "from lark.job.prepare_hook import main\nsys.exit(main())\n")

pytestmark = pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc (the CI installs it)")


def unused_gid() -> int:
    taken = {g.gr_gid for g in grp.getgrall()}
    return next(gid for gid in range(60999, 1000, -1) if gid not in taken)


@pytest.fixture(scope="module")
def hooks(tmp_path_factory) -> dict[str, Path]:
    if os.geteuid() != 0:
        pytest.skip("needs root: the compiled hook runs only setgid, as lark install-hook installs it")
    d = tmp_path_factory.mktemp("prepare_c")
    d.chmod(0o755)
    script = d / "hook.py"
    script.write_text(HOOK_SCRIPT)
    gid = unused_gid()
    out = {"script": script}
    for name, python in (("c", sys.executable), ("c_nopy", "/nonexistent/python")):
        binary = d / name
        subprocess.run(["gcc", *hook_launcher.CFLAGS, f"-DLARK_HOOK_PYTHON=\"{python}\"",
                        f"-DLARK_HOOK_SCRIPT=\"{script}\"", "-o", str(binary), str(hook_launcher.SOURCE)], check=True)
        os.chown(binary, 0, gid)
        os.chmod(binary, 0o2755)
        out[name] = binary
    return out


class Larkd(FakeLarkd):
    """FakeLarkd answering `answers` in turn since the last reset, the last one again and again."""

    def __init__(self, path: Path, answers: list[bytes]):
        self.reset(answers, 0)
        super().__init__(path, answers[0])

    def reset(self, answers: list[bytes], base: int | None = None) -> None:
        self.answers, self.base = list(answers), len(self.requests) if base is None else base

    @property  # type: ignore[override]
    def answer(self) -> bytes:  # read after each request is recorded
        return self.answers[min(len(self.requests) - 1 - self.base, len(self.answers) - 1)]

    @answer.setter
    def answer(self, value: bytes) -> None:
        pass


@pytest.fixture
def sock(tmp_path):
    path = tmp_path / "lark.sock"
    made: list[Larkd] = []

    def serve(*answers: bytes) -> Larkd:
        made.append(Larkd(path, list(answers)))
        return made[-1]
    yield path, serve
    for fake in made:
        fake.stop()


def run(argv: list[str], sock: Path, ad: str = AD, **env: str) -> tuple[int, str]:
    base = {"PATH": os.environ["PATH"], "LARK_SOCKET": str(sock), "LARK_CONFIG": str(sock) + ".no-toml"}
    cp = subprocess.run(argv, input=ad.encode(), env={**base, **env}, capture_output=True, timeout=120)
    assert cp.stderr == b"", cp.stderr
    return cp.returncode, cp.stdout.decode()


def both(hooks, sock: Path, fake: Larkd | None = None, answers: list[bytes] | None = None, ad: str = AD,
         **env: str) -> tuple[tuple[int, str], tuple[int, str], list[list[bytes]]]:
    """(exit code, stdout) of the Python hook, then of the compiled one, and the requests larkd got from each."""
    results, requests = [], []
    for argv in ([sys.executable, "-I", str(hooks["script"])], [str(hooks["c"])]):
        if fake and answers:
            fake.reset(answers)
        before = len(fake.requests) if fake else 0
        results.append(run(argv, sock, ad, **env))
        requests.append(fake.requests[before:] if fake else [])
    return results[0], results[1], requests


def hold(code: int, message: str) -> tuple[int, str]:
    return 1, f"HookStatusCode = {code}\nHookStatusMessage = \"{message}\"\n"


def test_ok_prints_nothing_and_asks_check_once(hooks, sock):
    path, serve = sock
    fake = serve(protocol.ok())
    py, c, (py_req, c_req) = both(hooks, path, fake)
    assert py == (0, "") and c == py
    assert py_req == [protocol.request("check")] and c_req == py_req


BUSY = protocol.encode({"ok": False, "busy": True, "error": "too many connections"})


@pytest.mark.parametrize("answer, code, said", [
    (protocol.error("policy: NetworkType 'vlan' needs a VLAN"), 112, "larkd: policy: NetworkType 'vlan' needs a VLAN"),
    (protocol.encode({"ok": False}), 112, "larkd: unknown error"),
    (protocol.encode({"ok": 0, "busy": 0, "error": 'a "quoted"  \\path\\  with  spaces '}), 112,
     'larkd: a \\"quoted\\" /path/ with spaces'),
    (BUSY, 111, "larkd: too many connections"),           # busy past the wait
    (protocol.encode({"ok": False, "busy": True}), 111, "larkd: busy"),
    (b"", 111, "{path}: larkd closed the connection without answering"),
])
def test_a_refusal_or_larkd_busy_past_the_wait_is_the_same_hold_ad(hooks, sock, answer, code, said):
    path, serve = sock
    fake = serve(answer)
    py, c, (py_req, c_req) = both(hooks, path, fake, LARK_PREFLIGHT_WAIT="0.5")
    said = said.format(path=path)
    if code == 111:
        assert py == hold(111, f"Lark: job not started: {said} ({AWAY_FIX})")
        assert len(c_req) >= 2 and set(c_req) == {protocol.request("check")}   # retried until the wait was over
    else:
        assert py == hold(112, f"Lark: job not started, its network was refused: {said}")
        assert len(c_req) == 1 and c_req == py_req
    assert c == py


def test_busy_then_ok_is_retried_to_the_same_end(hooks, sock):
    path, serve = sock
    answers = [BUSY, BUSY, protocol.ok()]
    fake = serve(*answers)
    py, c, (py_req, c_req) = both(hooks, path, fake, answers, LARK_PREFLIGHT_WAIT="5")
    assert py == (0, "") and c == py
    assert len(py_req) == 3 and c_req == py_req


@pytest.mark.parametrize("how", ["no_socket", "refused"])
def test_larkd_away_past_a_short_wait_is_the_same_hold_ad_111(hooks, sock, how):
    path, _ = sock
    unheard = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    if how == "refused":
        unheard.bind(str(path))   # a socket file nobody listens on
    why = {"no_socket": "no socket", "refused": "connection refused"}[how]
    py, c, _ = both(hooks, path, LARK_PREFLIGHT_WAIT="0.3")
    assert py == hold(111, f"Lark: job not started: {path}: larkd is not running ({why}) ({AWAY_FIX})")
    assert c == py
    # The compiled hook alone, its interpreter absent: the case never needed it.
    assert run([str(hooks["c_nopy"])], path, LARK_PREFLIGHT_WAIT="0.3") == py


@pytest.mark.parametrize("value", ["ten", "", " 1e ", "1__0"])
def test_a_bad_preflight_wait_is_ten_seconds(hooks, sock, value):
    """Busy three times, then ok: about 0.7-2.1 s of pauses, within 10 s but past a wait read as 0."""
    path, serve = sock
    busy = protocol.encode({"ok": False, "busy": True})
    answers = [busy, busy, busy, protocol.ok()]
    fake = serve(*answers)
    py, c, (py_req, c_req) = both(hooks, path, fake, answers, LARK_PREFLIGHT_WAIT=value)
    assert py == (0, "") and c == py
    assert len(py_req) == 4 and c_req == py_req


@pytest.mark.parametrize("value", ["0", " 0.2\t", "-1", "0_0.1"])
def test_a_good_short_preflight_wait_gives_up_alike(hooks, sock, value):
    path, _ = sock
    py, c, _ = both(hooks, path, LARK_PREFLIGHT_WAIT=value)
    assert py == hold(111, f"Lark: job not started: {path}: larkd is not running (no socket) ({AWAY_FIX})")
    assert c == py


def test_the_common_cases_need_no_interpreter(hooks, sock):
    path, serve = sock
    serve(protocol.error("refused by policy"))
    assert run([str(hooks["c_nopy"])], path) == hold(
        112, "Lark: job not started, its network was refused: larkd: refused by policy")


@pytest.mark.parametrize("answer", [
    protocol.error("VLAN «lab» is not on this execution point"),   # ensure_ascii: \u00ab in the answer
    protocol.error("tab\there"),                                    # not printable: classad_string's, not the C's
    b"not json\n",                                                  # client.py's own words for it
    protocol.encode({"ok": False, "error": 42}),                    # str() of a number
])
def test_what_the_c_cannot_reproduce_falls_back_to_the_python_hook_alike(hooks, sock, answer):
    path, serve = sock
    fake = serve(answer)
    py, c, (py_req, c_req) = both(hooks, path, fake, LARK_PREFLIGHT_WAIT="0.3")
    assert py[0] == 1 and py[1].startswith("HookStatusCode = 112\n")
    assert c == py
    assert c_req == py_req + py_req   # the compiled hook asked once, then the Python hook asked again
    # Without an interpreter the compiled hook says it cannot run it, rather than print a text of its own.
    code, out = run([str(hooks["c_nopy"])], path, LARK_PREFLIGHT_WAIT="0.3")
    assert code == 1 and "cannot run /nonexistent/python" in out


@pytest.mark.parametrize("ad", [AD, AD + 'Note = "café"\n', AD * 2000])
def test_the_python_hook_reads_the_same_job_ad_after_the_fallback(hooks, sock, tmp_path, ad):
    """A lark.toml that could move the socket (and a job ad that is not ASCII) go to the Python hook: the job ad
    the compiled hook read reaches it whole on stdin (120 kB too: more than a pipe holds)."""
    path, serve = sock
    serve(protocol.ok())
    toml = tmp_path / "lark.toml"
    toml.write_text(f'[daemon]\nsocket = "{path}"\n')
    copy = tmp_path / "ad-copy"
    env = {"LARK_SOCKET": "", "LARK_CONFIG": str(toml), "AD_COPY": str(copy)}
    assert run([str(hooks["c"])], path, ad, **env) == (0, "")
    assert copy.read_text(encoding="utf-8") == ad
    copy.unlink()
    if ad.isascii():   # an ASCII ad on the common path: the Python hook never runs
        assert run([str(hooks["c"])], path, ad, AD_COPY=str(copy)) == (0, "")
        assert not copy.exists()


def test_without_its_setgid_group_the_launcher_holds_the_job(hooks, sock, tmp_path):
    plain = tmp_path / "lark-prepare-job.nosgid"
    shutil.copyfile(hooks["c"], plain)
    plain.chmod(0o755)
    path, serve = sock
    serve(protocol.ok())
    code, out = run([str(plain)], path)
    assert code == 1 and "HookStatusCode = 112" in out and "runs without its setgid group" in out
