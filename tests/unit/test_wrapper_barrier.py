"""lark-job-wrapper's exit barrier, with real processes against a stand-in larkd on a Unix socket.

The wrapper is the job's process as the starter sees it: it must end the way the job's program ended (exit code
or signal), pass the starter's signals on, and ask larkd for the final push only after the program has ended,
waiting for a larkd that is restarting. Without a barrier (exit_barrier 0, or an older larkd) it becomes the job.
"""
from __future__ import annotations

import os
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


class FakeLarkd:
    """Answers `setup` with the given barrier and records each `push` with whether the job's marker existed."""

    def __init__(self, path: Path, barrier: float | None = 5.0, marker: Path | None = None):
        self.path, self.barrier, self.marker = path, barrier, marker
        self.pushes: list[dict] = []
        self.setups = 0
        self.ssh_sessions: list[dict] = []
        self.sock: socket.socket | None = None
        self.thread: threading.Thread | None = None
        self.answered = threading.Event()   # set once a request got its answer

    def start(self) -> "FakeLarkd":
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(str(self.path))
        self.sock.listen(8)
        # The socket itself, not self.sock: stop() may clear that before this thread first runs.
        self.thread = threading.Thread(target=self.serve, args=(self.sock,), daemon=True)
        self.thread.start()
        return self

    def serve(self, sock: socket.socket) -> None:
        while True:
            try:
                conn, _ = sock.accept()
            except OSError:
                return
            with conn:
                line = conn.makefile("rb").readline()
                if not line:    # the client went before it asked (as larkd, say nothing)
                    continue
                conn.sendall(self.answer(protocol.loads(line)))
                self.answered.set()

    def answer(self, msg: dict) -> bytes:
        if msg["op"] == "setup":
            self.setups += 1
            fields = {"plan": {}, "env": {"LARK_NETWORK_TYPE": "nat"}}
            if self.barrier is not None:
                fields["exit_barrier"] = self.barrier
            return protocol.ok(**fields)
        if msg["op"] == "ssh_session":     # as larkd answers when the slot's job has no network (yet)
            self.ssh_sessions.append(msg)
            return protocol.error("this slot's job has no network (yet)")
        assert msg["op"] == "push", msg
        self.pushes.append({**msg, "job_done": bool(self.marker and self.marker.exists())})
        return protocol.ok(pushed=True)

    def stop(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None
        self.path.unlink(missing_ok=True)


@pytest.fixture
def larkd(tmp_path):
    fakes = []

    def make(**kw) -> FakeLarkd:
        fake = FakeLarkd(tmp_path / "lark.sock", marker=tmp_path / "done", **kw).start()
        fakes.append(fake)
        return fake
    yield make
    for f in fakes:
        f.stop()


def wrapper(tmp_path: Path, *job: str, **kw) -> subprocess.Popen:
    env = {"PATH": os.environ["PATH"], "LARK_SOCKET": str(tmp_path / "lark.sock")}
    code = f"import sys; sys.path.insert(0, {str(REPO)!r}); from lark.job.wrapper import main; sys.exit(main())"
    return subprocess.Popen([sys.executable, "-I", "-c", code, *job], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, **kw)


def test_the_push_comes_after_the_program_ended_and_the_wrapper_ends_with_its_code(tmp_path, larkd):
    fake = larkd()
    p = wrapper(tmp_path, "sh", "-c", f'sleep 0.3; touch {tmp_path}/done; exit 7')
    out, err = p.communicate(timeout=30)
    assert p.returncode == 7, err
    assert len(fake.pushes) == 1 and fake.pushes[0]["barrier"] is True
    assert fake.pushes[0]["job_done"], "the barrier's push came before the job's program had ended"


def test_the_starters_signal_reaches_the_program(tmp_path, larkd):
    fake = larkd()
    ready = tmp_path / "ready"
    p = wrapper(tmp_path, "sh", "-c", f'trap "touch {tmp_path}/done; exit 42" TERM; touch {ready}; '
                                      'while :; do sleep 0.1; done')
    deadline = time.monotonic() + 20
    while not ready.exists():
        assert time.monotonic() < deadline and p.poll() is None, p.stderr.read() if p.stderr else ""
        time.sleep(0.05)
    p.send_signal(signal.SIGTERM)
    p.communicate(timeout=30)
    assert p.returncode == 42
    assert [x["job_done"] for x in fake.pushes] == [True]


def test_a_program_killed_by_a_signal_makes_the_wrapper_end_by_the_same_signal(tmp_path, larkd):
    larkd()
    p = wrapper(tmp_path, "sh", "-c", "kill -USR1 $$")
    p.communicate(timeout=30)
    assert p.returncode == -signal.SIGUSR1
    assert not list(tmp_path.glob("core*"))


def test_the_program_gets_default_sigpipe_and_sigxfsz(tmp_path, larkd):
    """Python starts with SIGPIPE ignored and exec keeps ignored signals: `yes | head` must end `yes`."""
    larkd()
    p = wrapper(tmp_path, "sh", "-c", "grep SigIgn /proc/self/status")
    out, _ = p.communicate(timeout=30)
    ignored = int(out.split()[1], 16)
    assert not ignored & (1 << (signal.SIGPIPE - 1)) and not ignored & (1 << (signal.SIGXFSZ - 1)), out


def test_a_program_that_cannot_be_executed_fails_with_the_reason_and_no_push(tmp_path, larkd):
    fake = larkd()
    p = wrapper(tmp_path, str(tmp_path / "no-such-program"))
    _, err = p.communicate(timeout=30)
    assert p.returncode == 111
    assert "cannot execute" in err and "No such file" in err
    assert fake.pushes == []


def test_the_barrier_waits_for_a_restarting_larkd(tmp_path, larkd):
    """larkd dies while the job runs and comes back 2 s after the program ended: the push still happens."""
    fake = larkd()
    p = wrapper(tmp_path, "sh", "-c", f"sleep 0.5; touch {tmp_path}/done")
    time.sleep(0.3)
    fake.stop()  # larkd is down when the program ends
    while not (tmp_path / "done").exists():
        time.sleep(0.05)
    time.sleep(2)
    assert p.poll() is None, "the wrapper left without waiting for larkd"
    back = larkd()
    p.communicate(timeout=30)
    assert p.returncode == 0
    assert [x["job_done"] for x in back.pushes] == [True]


def test_past_the_bound_the_job_still_ends_with_its_code_and_says_why(tmp_path, larkd):
    fake = larkd(barrier=1.0)
    p = wrapper(tmp_path, "sh", "-c", "sleep 0.5; exit 3")
    time.sleep(0.2)
    fake.stop()
    _, err = p.communicate(timeout=30)
    assert p.returncode == 3
    assert "final network figures were not written" in err and "larkd is not running" in err


@pytest.mark.parametrize("barrier", [0, None])
def test_without_a_barrier_the_wrapper_becomes_the_program(tmp_path, larkd, barrier):
    fake = larkd(barrier=barrier)
    p = wrapper(tmp_path, "sh", "-c", "echo $$")
    out, _ = p.communicate(timeout=30)
    assert p.returncode == 0 and int(out) == p.pid
    assert fake.pushes == []


def test_condor_ssh_to_job_sshd_asks_larkd_and_runs_unnetworked_when_refused(tmp_path, larkd):
    """The starter's sshd for condor_ssh_to_job comes through the wrapper in an empty netns of its own: the wrapper
    asks larkd to run it in the job's namespace (ssh_session) and, when larkd refuses (no network yet), runs it
    where it is, unnetworked, never asking for a setup. Only that exact shape is recognised."""
    from lark.job.wrapper import is_ssh_to_job_sshd
    cfg = "/var/lib/condor/execute/dir_1/scratch/.condor_ssh_to_job_1/sshd_config"
    assert is_ssh_to_job_sshd(["/usr/sbin/sshd", "-i", "-e", "-f", cfg])
    assert not is_ssh_to_job_sshd(["/usr/sbin/sshd", "-i", "-e", "-f", "/home/alice/sshd_config"])
    assert not is_ssh_to_job_sshd(["/usr/bin/python3", "-i", "-e", "-f", cfg])
    assert not is_ssh_to_job_sshd(["/usr/sbin/sshd", "-D", "-e", "-f", cfg])
    fake = larkd()
    sshd = tmp_path / "sshd"
    sshd.write_text("#!/bin/sh\necho ran \"$@\"\n")
    sshd.chmod(0o755)
    p = wrapper(tmp_path, str(sshd), "-i", "-e", "-f", cfg)
    out, err = p.communicate(timeout=30)
    assert p.returncode == 0 and out.startswith("ran -i -e -f"), err
    assert [m["argv"] for m in fake.ssh_sessions] == [[str(sshd), "-i", "-e", "-f", cfg]]
    assert fake.pushes == [] and not fake.setups


class RefusingLarkd(FakeLarkd):
    """Refuses setup, saying (or not) that it put the job on hold at its schedd."""

    def __init__(self, path: Path, held: bool):
        super().__init__(path)
        self.held = held

    def answer(self, msg: dict) -> bytes:
        return protocol.error("job 1.0: setup failed: no IPv6 pool", **({"held": True} if self.held else {}))


@pytest.mark.parametrize("held", [True, False])
def test_a_held_job_waits_to_be_vacated_and_an_unheld_one_fails_at_once(tmp_path, held):
    """Issue 23 item 3: after a failed setup, exiting 111 at once lets HTCondor record the job as completed; when
    larkd has put the job on hold, the wrapper waits for the starter to kill it (the shadow vacates held jobs)."""
    fake = RefusingLarkd(tmp_path / "lark.sock", held).start()
    try:
        p = wrapper(tmp_path, "true")
        if held:
            # A loaded machine may take seconds to start the wrapper: the wait for the vacate starts at its answer.
            assert fake.answered.wait(30), "the wrapper never asked larkd to set up"
            time.sleep(1.5)
            assert p.poll() is None, "a held job's wrapper exited before it was vacated"
            p.send_signal(signal.SIGTERM)  # the starter vacating it
            _, err = p.communicate(timeout=30)
            assert p.returncode == -signal.SIGTERM
        else:
            _, err = p.communicate(timeout=30)
            assert p.returncode == 111
        assert "no IPv6 pool" in err
    finally:
        fake.stop()
