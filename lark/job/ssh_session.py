"""The wrapper's side of a condor_ssh_to_job session: have larkd run the starter's sshd in the job's network.

larkd answers `started` once its sshd holds the session's descriptors; this process then lets go of its own copies
(else the session would not end when that sshd exits) and waits for the exit code. The starter ends a session by
killing this process; larkd sees the connection close and ends the sshd. larkd/daemon/ssh_session.py says why.
"""
from __future__ import annotations

import _socket
import os

from .. import protocol
from ..errors import LarkError
from .client import socket_path

NO_SESSION = None


def _answers(s: _socket.socket):
    buf = b""
    while True:
        while b"\n" not in buf:
            chunk = s.recv(65536)
            if not chunk:
                return
            buf += chunk
        line, buf = buf.split(b"\n", 1)
        answer = protocol.loads(line)
        if not isinstance(answer, dict):
            raise LarkError("larkd sent an unreadable answer", obj="ssh_session")
        yield answer


def _let_go_of_standard_fds() -> None:
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    os.close(null)


def run_in_job_network(argv: list[str]) -> int | None:
    """The session's exit code once larkd's sshd in the job's namespace has ended; None (with the reason on
    stderr, which the starter keeps in the session's sshd.log) when larkd will not run it: the caller then runs
    the sshd where it is, in an empty namespace, without any network."""
    code, refusal = run_by_larkd("ssh_session", argv)
    if refusal is not None:
        os.write(2, f"Lark: ssh session without the job's network: {refusal['error']}\n".encode())
        return NO_SESSION
    return code


def run_by_larkd(op: str, argv: list[str], **fields) -> tuple[int, dict | None]:
    """Have larkd run a program in the job's namespace with this process's standard descriptors (`op` says which
    program and how larkd checks `argv`): (its exit code, None), or (255, larkd's refusal, whose `error` says
    why) when larkd will not run it. Once larkd's program runs, this process lets go of its standard
    descriptors."""
    s = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    try:
        try:
            s.connect(socket_path())
            s.sendall(protocol.request(op, argv=argv, **fields))
            answers = _answers(s)
            first = next(answers, None)
        except (OSError, LarkError, ValueError) as e:
            return 255, {"error": str(e)}
        if first is None or not first.get("ok"):
            return 255, first if first and isinstance(first.get("error"), str) else {
                "error": "larkd closed the connection"}
        _let_go_of_standard_fds()   # from here on the descriptors are larkd's program's, whatever happens
        try:
            last = next(answers, None)
        except (OSError, LarkError, ValueError):
            last = None
    finally:
        s.close()
    if last is None or not isinstance(last.get("exit_code"), int):
        return 255, None   # larkd went away meanwhile (its program ends with it: parent-death signal)
    code: int = last["exit_code"]
    return (code if code >= 0 else 128 - code), None
