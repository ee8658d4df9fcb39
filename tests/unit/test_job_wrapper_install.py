"""`lark install-hook`'s job wrapper step (lark/hook_launcher.install_job_wrapper): the compiled wrapper at
$(LARK_LIBEXEC)/lark-job-wrapper, root:root 0755, not setgid, falling back to the Python wrapper; where it cannot
be compiled (no cc, a compiler that fails) or is not wanted, a symlink to the Python wrapper, and the reason said."""
from __future__ import annotations

import logging
import os
import shutil
import socket
import stat
import subprocess
import threading
from pathlib import Path

import pytest

from lark import hook_launcher, protocol

needs_root_and_gcc = pytest.mark.skipif(os.geteuid() != 0 or shutil.which("gcc") is None,
                                        reason="installs root-owned files and compiles with gcc")


@pytest.fixture
def dirs(tmp_path):
    d = tmp_path / "libexec"
    py = tmp_path / "py-wrapper"
    py.write_text('#!/bin/sh\necho "python wrapper: $*"\nexit 98\n')
    py.chmod(0o755)
    os.chmod(tmp_path, 0o755)
    return d, py


def serve_once(path: Path, answer: bytes) -> threading.Thread:
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(str(path))
    srv.listen(1)

    def one() -> None:
        conn, _ = srv.accept()
        with conn:
            conn.makefile("rb").readline()
            conn.sendall(answer)
        srv.close()
    t = threading.Thread(target=one, daemon=True)
    t.start()
    return t


@needs_root_and_gcc
def test_compiled_wrapper_installed_root_0755_not_setgid_and_works(dirs, tmp_path):
    d, py = dirs
    dest = d / "lark-job-wrapper"
    assert hook_launcher.install_job_wrapper(dest, py) is True
    st = os.lstat(dest)
    assert stat.S_ISREG(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o755 and st.st_uid == 0 and st.st_gid == 0
    assert dest.read_bytes()[:4] == b"\x7fELF"
    sock = tmp_path / "lark.sock"
    t = serve_once(sock, protocol.ok(plan={}, env={"LARK_NETWORK_TYPE": "nat"}, exit_barrier=0))
    cp = subprocess.run([str(dest), "sh", "-c", 'echo "job $LARK_NETWORK_TYPE"'], env={"LARK_SOCKET": str(sock),
                        "PATH": os.environ["PATH"]}, capture_output=True, text=True, timeout=30)
    t.join(5)
    assert cp.returncode == 0 and cp.stdout == "job nat\n", cp.stderr
    # larkd away: the Python wrapper (the one named at install) gets the job's arguments
    cp = subprocess.run([str(dest), "true", "x"], env={"LARK_SOCKET": str(tmp_path / "none.sock")},
                        capture_output=True, text=True, timeout=30)
    assert cp.returncode == 98 and cp.stdout == "python wrapper: true x\n"


@needs_root_and_gcc
@pytest.mark.parametrize("how", ["no_cc", "cc_fails", "asked"])
def test_without_a_compiler_the_python_wrapper_stays_and_says_why(dirs, caplog, how):
    d, py = dirs
    dest = d / "lark-job-wrapper"
    assert hook_launcher.install_job_wrapper(dest, py) is True  # a compiled one from before is replaced too
    cc = {"no_cc": "lark-no-such-cc", "cc_fails": "false", "asked": "gcc"}[how]
    with caplog.at_level(logging.WARNING, logger="lark.hook_launcher"):
        assert hook_launcher.install_job_wrapper(dest, py, cc=cc, compiled=how != "asked") is False
    assert dest.is_symlink() and os.readlink(dest) == str(py)
    said = caplog.text
    assert {"no_cc": "no C compiler 'lark-no-such-cc'", "cc_fails": "false failed",
            "asked": "--python-job-wrapper"}[how] in said, said
    assert not list(d.glob(".lark-job-wrapper.*")), "a temporary file was left"


def test_a_fallback_path_that_cannot_be_compiled_in_is_refused(dirs):
    d, _ = dirs
    with pytest.raises(Exception, match="absolute path"):
        hook_launcher.install_job_wrapper(d / "lark-job-wrapper", Path('/opt/la"rk/bin/lark-job-wrapper'))
