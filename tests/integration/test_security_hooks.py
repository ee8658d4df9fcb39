"""A job tracing Lark's hooks (issue 14 item 2). The PREPARE_JOB hook runs as the job's user in the host's network
namespace; a process of that user that could ptrace it would act in the host's namespace, outside its limits and
filter. (There is no JOB_EXIT hook any more: the exit barrier is held by the job's wrapper, which runs in the job's
own namespace, so tracing it gives the job nothing it does not have.) The hook makes itself non-dumpable first thing: this test attacks a running hook with
PTRACE_ATTACH from another process of the same uid (the kernel here has no yama, so only dumpability stands in
the way), and attacks a plain process of that uid the same way to show the attack works where nothing stops it."""
import os
import subprocess
import time

import pytest

from helpers.fakehost import HERE, JOB_PY

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run processes as another uid")
UID = 65534
REPO = str(HERE.parent.parent)
# Run as UID: PTRACE_ATTACH to the pid in argv[1]; print the errno (0: attached, then detached).
ATTACK = ("import ctypes,sys,os\n"
          "libc=ctypes.CDLL(None,use_errno=True)\n"
          "pid=int(sys.argv[1])\n"
          "r=libc.ptrace(16,pid,None,None)\n"       # PTRACE_ATTACH
          "e=ctypes.get_errno()\n"
          "if r==0:\n"
          "    os.waitpid(pid,0); libc.ptrace(17,pid,None,None)\n"   # PTRACE_DETACH
          "print(0 if r==0 else e)\n")


def as_uid(argv: list[str], **kw) -> subprocess.Popen:
    return subprocess.Popen(["setpriv", f"--reuid={UID}", f"--regid={UID}", "--clear-groups", *argv], **kw)


def attack(pid: int) -> int:
    cp = subprocess.run(["setpriv", f"--reuid={UID}", f"--regid={UID}", "--clear-groups", JOB_PY, "-c", ATTACK,
                         str(pid)], capture_output=True, text=True, timeout=20)
    assert cp.returncode == 0, cp.stderr
    return int(cp.stdout.strip())


def wait_untraceable(pid: int, timeout: float = 15.0) -> None:
    """Until the hook has run its first statement: a non-dumpable process's /proc entries belong to root."""
    deadline = time.monotonic() + timeout

    def runs_as_uid() -> bool:  # setpriv starts as root: only after it dropped to UID does ownership mean anything
        with open(f"/proc/{pid}/status") as f:
            return any(line.startswith("Uid:") and line.split()[1] == str(UID) for line in f)
    while not runs_as_uid() or os.stat(f"/proc/{pid}/status").st_uid != 0:
        assert time.monotonic() < deadline, f"hook pid {pid} never became non-dumpable"
        time.sleep(0.02)


def hook(module: str, env: dict, args: list[str] = ()) -> subprocess.Popen:
    return as_uid([JOB_PY, "-m", module, *args], env={"PYTHONPATH": REPO, "PATH": "/usr/bin:/bin", **env},
                  stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd="/")


def test_a_process_of_the_same_uid_can_be_traced_where_nothing_stops_it():
    """The control: the attack below is real on this kernel (no yama): a plain same-uid process is traced."""
    victim = as_uid([JOB_PY, "-c", "import time; time.sleep(30)"])
    try:
        time.sleep(0.3)
        assert attack(victim.pid) == 0
    finally:
        victim.kill()
        victim.wait()


def test_prepare_job_hook_cannot_be_traced_by_the_jobs_user():
    # larkd absent: the hook retries for LARK_PREFLIGHT_WAIT seconds, long enough to be attacked.
    p = hook("lark.job.prepare_hook", {"LARK_SOCKET": "/run/lark-hooktest-absent/lark.sock",
                                       "LARK_PREFLIGHT_WAIT": "8"})
    try:
        wait_untraceable(p.pid)
        assert attack(p.pid) == 1   # EPERM
        assert p.poll() is None     # it went on waiting, untouched
    finally:
        p.kill()
        p.wait()
