"""lark-job-wrapper: HTCondor's USER_JOB_WRAPPER. Get the job its network, run the job, then hold the exit barrier.

The job never runs without the network it asked for: on any failure the wrapper exits 111 (EXIT_NO_NETWORK) with
the reason on stderr and in $_CONDOR_WRAPPER_ERROR_FILE. HTCondor 25.x does not act on that file, so the job's
hold comes from the PREPARE_JOB hook (prepare_hook.py), which checks everything knowable before the job starts
(the policy, and whether this EP can build the plan: lark/realize/feasibility.py); what is left here is a failure
between that check and the setup (larkd dying in that window, an address pool exhausted meanwhile): larkd then
holds the job at its schedd and the wrapper waits to be vacated, or, with no schedd to ask, the job ends with exit
code 111 and the reason in its stderr.

The exit barrier: the starter treats this process as the job, so while it lives the job has not ended. The wrapper
therefore forks the job's program, passes on every signal the starter sends, and when the program has ended asks
larkd to write the job's final figures into its ad (`push` with `barrier`), waiting for larkd up to the
`exit_barrier_wait` larkd announced (condor_master restarts a dead larkd within ~20 s), then ends the way the
program ended (same exit code, or the same signal). Why not HTCondor's JOB_EXIT hook: on 24.x and 25.x the starter
exits as soon as that hook returns, in the middle of the job's output transfer, and the job is evicted and runs
again without end (docs/design.md, "The exit barrier"). With `exit_barrier_wait = 0` the wrapper execs the job
as before and there is no barrier.
"""
from __future__ import annotations

import _signal as signal  # the C module: `signal` imports enum, milliseconds of every job's start
import os
import sys

from ..errors import LarkError
from .client import call_patiently

EXIT_NO_NETWORK = 111
EXIT_NOT_EXECUTED = 127
HELD_WAIT_S = 60.0  # how long a job larkd put on hold waits for the starter to vacate it before exiting 111
# The wrapper never forwards these: they are the kernel's reports about the wrapper itself (or cannot be caught).
NOT_FORWARDED = frozenset({signal.SIGCHLD, signal.SIGKILL, signal.SIGSTOP, signal.SIGSEGV, signal.SIGBUS,
                           signal.SIGILL, signal.SIGFPE, signal.SIGTRAP, signal.SIGSYS, signal.SIGPIPE})
# Python ignores these at start and exec keeps ignored signals ignored: the job gets the defaults back.
RESTORED_IN_JOB = (signal.SIGPIPE, signal.SIGXFSZ)


def say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def fail(reason: str) -> int:
    line = f"Lark: job not started, its network could not be set up: {reason}"
    say(line)
    err_file = os.environ.get("_CONDOR_WRAPPER_ERROR_FILE")
    if err_file:
        try:
            with open(err_file, "w") as f:
                f.write(line + "\n")
        except OSError:
            pass
    return EXIT_NO_NETWORK


def wait_to_be_vacated(limit: float = HELD_WAIT_S) -> None:
    """larkd has put the job on hold at its schedd: the shadow will have the starter kill this process. Exiting
    first would let the starter report the job as completed (exit code 111) before the hold lands."""
    import time
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        time.sleep(min(1.0, max(0.0, deadline - time.monotonic())))


def exec_job(argv: list[str]) -> None:
    for sig in RESTORED_IN_JOB:
        signal.signal(sig, signal.SIG_DFL)
    os.execvp(argv[0], argv)


class Forwarder:
    """Signals for the wrapper go to the job's program: the starter signals the job's pid, which is this one."""

    def __init__(self) -> None:
        self.child = 0
        self.pending: list[int] = []

    def __call__(self, signum: int, _frame: object) -> None:
        if self.child:
            try:
                os.kill(self.child, signum)
            except ProcessLookupError:
                pass
        else:
            self.pending.append(signum)  # arrived between installing the handlers and the fork

    def install(self) -> None:
        for sig in signal.valid_signals():
            if sig in NOT_FORWARDED:
                continue
            try:
                signal.signal(sig, self)
            except (OSError, ValueError):
                pass  # real-time signals glibc keeps for itself

    def stop(self) -> None:
        """The program has ended: its pid may be reused, and a signal now (condor_rm during the barrier) is for
        the wrapper itself, with its default effect."""
        self.child = 0
        for sig in signal.valid_signals():
            if sig not in NOT_FORWARDED and signal.getsignal(sig) is self:
                signal.signal(sig, signal.SIG_DFL)

    def started(self, child: int) -> None:
        self.child = child
        for signum in self.pending:
            self(signum, None)
        self.pending.clear()


def spawn(argv: list[str], forwarder: Forwarder) -> int:
    """Fork and exec the job's program; its pid. OSError (with the exec's errno) if it could not be executed."""
    rfd, wfd = os.pipe2(os.O_CLOEXEC)
    pid = os.fork()
    if pid == 0:  # the job's program: nothing here may return into the wrapper's code
        try:
            os.close(rfd)
            exec_job(argv)
        except OSError as e:
            os.write(wfd, str(e.errno or 0).encode())
        finally:
            os._exit(EXIT_NOT_EXECUTED)
    forwarder.started(pid)
    os.close(wfd)
    with os.fdopen(rfd, "rb") as r:
        errno_text = r.read()  # empty: the exec succeeded and closed the pipe
    if errno_text:
        os.waitpid(pid, 0)
        err = int(errno_text)
        raise OSError(err, os.strerror(err))
    return pid


def end_like(status: int) -> int:
    """End this process the way the job's program ended, so the starter and the job's history see the same."""
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        import resource
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # the program dumped its own core if it could
        signal.signal(sig, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {sig})
        os.kill(os.getpid(), sig)
        return 128 + sig  # a signal whose default is not to end the process
    return os.waitstatus_to_exitcode(status)


def barrier(wait: float) -> None:
    """Ask larkd to write the job's final figures; never fails the job (its history keeps the last push)."""
    try:
        answer = call_patiently("push", wait=wait, timeout=30, barrier=True)
    except LarkError as e:
        say(f"Lark: the job's final network figures were not written into its ad ({e}); its history keeps the "
            "last periodic figures and larkd's record keeps the exact ones")
        return
    if not answer.get("pushed") and answer.get("reason"):
        say(f"Lark: final network figures not pushed: {answer['reason']}")


def is_ssh_to_job_sshd(argv: list[str]) -> bool:
    """The starter runs condor_ssh_to_job's sshd through USER_JOB_WRAPPER too, in a fresh empty netns of its own
    (NO_JOB_NETWORKING applies to every process it starts), as `sshd -i -e -f <scratch>/.condor_ssh_to_job_N/...`."""
    return (os.path.basename(argv[0]) == "sshd" and argv[1:3] == ["-i", "-e"] and len(argv) == 5
            and argv[3] == "-f" and "/.condor_ssh_to_job_" in argv[4])


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv:
        print("usage: lark-job-wrapper PROGRAM [ARGS...]", file=sys.stderr)
        return 2
    if is_ssh_to_job_sshd(argv):
        # This sshd sits in a namespace of its own, empty: larkd runs it in the job's (ssh_session.py). When larkd
        # will not (no network for the job yet, larkd away), it runs here, without a network: the session never
        # sees the host's network. A job that names sshd as its own program this way gets no network.
        from .ssh_session import run_in_job_network
        code = run_in_job_network(argv)
        if code is not None:
            return code
        try:
            exec_job(argv)
        except OSError as e:
            return fail(f"cannot execute {argv[0]}: {e.strerror}")
    try:
        timeout = float(os.environ.get("LARK_WRAPPER_TIMEOUT", "60"))
    except ValueError:
        timeout = 60.0
    try:
        answer = call_patiently("setup", wait=20, timeout=timeout)
    except LarkError as e:
        code = fail(str(e))
        if getattr(e, "held", False):
            wait_to_be_vacated()
        return code
    os.environ.update(answer.get("env", {}))
    announced = answer.get("exit_barrier")
    wait = float(announced) if isinstance(announced, (int, float)) else 0.0
    if wait <= 0:
        try:
            exec_job(argv)  # no barrier asked for (or a larkd from before it): become the job
        except OSError as e:
            return fail(f"cannot execute {argv[0]}: {e.strerror}")
    forwarder = Forwarder()
    forwarder.install()
    try:
        child = spawn(argv, forwarder)
    except OSError as e:
        return fail(f"cannot execute {argv[0]}: {e.strerror}")
    _, status = os.waitpid(child, 0)  # retried by Python after each forwarded signal (PEP 475)
    forwarder.stop()
    barrier(wait)
    return end_like(status)


if __name__ == "__main__":
    sys.exit(main())
