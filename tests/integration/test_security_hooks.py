"""A job tracing Lark's hooks (issue 14 item 2). The PREPARE_JOB hook runs as the job's user in the host's network
namespace; a process of that user that could ptrace it would act in the host's namespace, outside its limits and
filter. (There is no JOB_EXIT hook any more: the exit barrier is held by the job's wrapper, which runs in the job's
own namespace, so tracing it gives the job nothing it does not have.) The hook makes itself non-dumpable first
thing: this test attacks a running hook with PTRACE_ATTACH from another process of the same uid (the kernel here has
no yama, so only dumpability stands in the way), and attacks a plain process of that uid the same way to show the
attack works where nothing stops it.

The hook's start (issue 23 item 15): a prctl runs only once the interpreter has started and imported, so a tracer
that is handed the hook's pid as it is forked attaches first. The setgid launcher (lark/job/launcher/prepare_job.c,
`lark install-hook`) starts the hook never dumpable: the race below wins against the plain hook and never against
the launcher."""
import grp
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest
from helpers.fakehost import HERE, JOB_PY

from lark import hook_launcher, hostcheck

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


# Run as UID, started before any hook: for each pid read from stdin (written the instant the root parent has forked
# the hook), PTRACE_ATTACH in a loop from the first instant until it gets in or the hook is gone (reaped: ESRCH).
# Prints "attached" or "refused", and whether it saw the hook's interpreter run (its command line, readable by
# anyone) while it was refused: a refusal then happened during the interpreter's start, not only around it. Its
# argument, when given, is what to look for in the command line instead of the Python hook's script.
RACER = ("import ctypes,errno,os,sys\n"
         "needle=sys.argv[1].encode() if len(sys.argv)>1 else b'hook.py'\n"
         "libc=ctypes.CDLL(None,use_errno=True)\n"
         "libc.ptrace.argtypes=[ctypes.c_long,ctypes.c_long,ctypes.c_void_p,ctypes.c_void_p]\n"
         "print('ready',flush=True)\n"
         "for line in sys.stdin:\n"
         "    pid=int(line); seen=False\n"
         "    while True:\n"
         "        if libc.ptrace(16,pid,None,None)==0:\n"                # PTRACE_ATTACH
         "            st=os.waitpid(pid,0)[1]; libc.ptrace(17,pid,None,None)\n"  # PTRACE_DETACH
         "            os.kill(pid,18)\n"   # SIGCONT: a SIGSTOP of the attach still pending must not stop the hook
         "            print('attached',seen,st,flush=True); break\n"
         "        if ctypes.get_errno()==errno.ESRCH:\n"
         "            print('refused',seen,0,flush=True); break\n"
         "        try:\n"
         "            with open(f'/proc/{pid}/cmdline','rb') as f: seen=seen or needle in f.read()\n"
         "        except OSError: pass\n")
STARTS = 30
# The hook as the launcher runs it: `python -I hook.py`; -I keeps PYTHONPATH out, so it finds this checkout itself.
HOOK_SCRIPT = f"import sys\nsys.path.insert(0, {REPO!r})\nfrom lark.job.prepare_hook import main\nsys.exit(main())\n"
HOOK_ENV = {"PATH": "/usr/bin:/bin", "LARK_SOCKET": "/run/lark-hooktest-absent/lark.sock", "LARK_PREFLIGHT_WAIT": "0"}


def unused_gid() -> int:
    """A gid no group and no user has: the launcher's group, as `lark install-hook` makes lark-hook (this test
    leaves the machine's group database alone)."""
    taken = {g.gr_gid for g in grp.getgrall()}
    return next(gid for gid in range(60999, 1000, -1) if gid not in taken)


@pytest.fixture(scope="module")
def hookdir():
    """A root-owned directory UID may read: the hook's script and the launcher built for it by install()."""
    d = Path(tempfile.mkdtemp(prefix="lark-hooktest-"))
    d.chmod(0o755)
    (d / "hook.py").write_text(HOOK_SCRIPT)
    hook_launcher.install(d / "lark-prepare-job", Path(JOB_PY), d / "hook.py", unused_gid())
    yield d
    shutil.rmtree(d)


def race(argv: list[str], starts: int, stop_when_attached: bool, env: dict = HOOK_ENV,
         needle: str | None = None) -> list[tuple[str, bool, str]]:
    """Start the hook `starts` times as UID from a root parent, handing each pid to the racer at once.
    (racer's verdict, whether it saw the interpreter while refused, the hook's stdout) per start."""
    racer = as_uid([JOB_PY, "-c", RACER, *([needle] if needle else [])], stdin=subprocess.PIPE,
                   stdout=subprocess.PIPE, text=True, cwd="/")
    results = []
    try:
        assert racer.stdout.readline() == "ready\n"   # its interpreter is up before the first hook starts
        for _ in range(starts):
            p = as_uid(argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                       stderr=subprocess.DEVNULL, text=True, cwd="/")
            racer.stdin.write(f"{p.pid}\n")
            racer.stdin.flush()
            out, _ = p.communicate(timeout=20)   # reaped: the racer's next attach gets ESRCH
            verdict, seen, _ = racer.stdout.readline().split()
            results.append((verdict, seen == "True", out))
            if stop_when_attached and verdict == "attached":
                break
    finally:
        racer.kill()
        racer.wait()
    return results


def test_a_racer_attaches_to_the_plain_python_hook_during_its_start(hookdir):
    """The control: the race is real on this kernel. The plain hook makes itself non-dumpable first thing, yet a
    same-uid racer handed its pid gets in before that, in at most STARTS starts."""
    results = race([JOB_PY, "-I", str(hookdir / "hook.py")], STARTS, stop_when_attached=True)
    assert results[-1][0] == "attached", results
    assert "HookStatusCode = 111" in results[-1][2]   # and the hook went on to its answer after the detach


@pytest.mark.parametrize("path", ["python", "compiled"])
def test_the_setgid_launcher_starts_the_hook_untraceable_from_its_first_instruction(hookdir, path):
    """Both of the launcher's paths: the Python hook it execs where a lark.toml could move larkd's socket (the exec
    chain), and its own compiled check (no second exec), kept alive for a while by a larkd that is away."""
    launcher = str(hookdir / "lark-prepare-job")
    if path == "python":
        (hookdir / "lark.toml").write_text(f'[daemon]\nsocket = "{HOOK_ENV["LARK_SOCKET"]}"\n')
        env = {**HOOK_ENV, "LARK_SOCKET": "", "LARK_CONFIG": str(hookdir / "lark.toml")}
        results = race([launcher], STARTS, stop_when_attached=False, env=env)
    else:
        env = {**HOOK_ENV, "LARK_PREFLIGHT_WAIT": "0.3"}
        results = race([launcher], STARTS // 3, stop_when_attached=False, env=env, needle="lark-prepare-job")
    assert [r[0] for r in results] == ["refused"] * len(results)
    # Not vacuous: each time the hook ran to its answer (larkd unreachable), and the racer was refused while the
    # hook ran (the Python one's interpreter; in most starts: under load a racer may get no CPU during one start).
    assert all("HookStatusCode = 111" in out for _, _, out in results), results
    assert sum(seen for _, seen, _ in results) >= len(results) // 2, results


def test_the_launcher_refuses_to_start_the_hook_without_its_setgid_group(hookdir, tmp_path):
    """Copied without its mode (or on a nosuid mount) the hook would start traceable again: the job is held."""
    plain = hookdir / "lark-prepare-job.nosgid"
    shutil.copyfile(hookdir / "lark-prepare-job", plain)
    plain.chmod(0o755)                                   # no setgid bit, owner root
    try:
        cp = subprocess.run(["setpriv", f"--reuid={UID}", f"--regid={UID}", "--clear-groups", str(plain)],
                            env=HOOK_ENV, capture_output=True, text=True, timeout=20)
        assert cp.returncode == 1
        assert "HookStatusCode = 112" in cp.stdout and "runs without its setgid group" in cp.stdout
        assert "lark install-hook" in cp.stdout
    finally:
        plain.unlink()


def test_doctor_tells_the_launcher_from_the_plain_hook(hookdir, tmp_path):
    def config(hook: str):
        values = {"STARTER_JOB_HOOK_KEYWORD": "LARK", "LARK_HOOK_PREPARE_JOB": hook}
        return lambda argv: (0, values[argv[1]] + "\n") if argv[1] in values else (1, "")
    absent_yama = str(tmp_path / "no-yama")
    f = hostcheck.prepare_job_start(config(str(hookdir / "lark-prepare-job")), absent_yama)
    assert f.ok and "setgid launcher" in f.found, f
    f = hostcheck.prepare_job_start(config(str(hookdir / "hook.py")), absent_yama)
    assert not f.ok and "not the setgid launcher" in f.found and "lark install-hook" in f.fix, f
