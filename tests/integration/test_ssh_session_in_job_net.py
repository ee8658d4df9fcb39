"""condor_ssh_to_job sessions in the job's own network (issue 22; lark/daemon/ssh_session.py), on the fake execution
point: larkd runs the session's program (`ssh_sshd`, here a script standing in for sshd that reports where it
runs) in the asking job's namespace, as its uid, with no capability; ends it when the asker goes; and refuses
anyone who is not a job's process."""
import json
import os
import secrets
import shutil
import signal
import tempfile
import time
from pathlib import Path

import pytest

from helpers.fakehost import HERE, JOB_PY, sh
from test_security_daemon import HOSTILE, results, root_request, spawn_hostile

FAKE_SSHD = """#!/bin/sh
# stands in for sshd -i -e -f CONFIG: says where it runs, on the session's stdout
echo "SESSION netns=$(readlink /proc/self/ns/net) uid=$(id -u) $(grep CapEff /proc/self/status | tr -d '\\t') \
$(grep NoNewPrivs /proc/self/status | tr -d '\\t') mark=$LARK_SESSION_MARK \
cg=$(grep ':memory:' /proc/self/cgroup | cut -d: -f3) args=$*"
echo $$ > "$(dirname "$0")/sshd-$(basename "$(dirname "$4")").pid"
case "$4" in
  *linger*) sleep 300;;
  *leftover*) setsid sleep 300 </dev/null >/dev/null 2>&1 &
    # until it has left this session (field 6 of stat: its session id), it is in the group larkd kills when
    # this program exits, and would die before it could be a leftover
    until [ "$(cut -d' ' -f6 /proc/$!/stat)" = "$!" ]; do sleep 0.05; done
    echo $! > "$(dirname "$0")/leftover.pid";;
esac
exit 7
"""


@pytest.fixture
def bin_dir():
    """Where the stand-in sshd lives: outside pytest's private tmp (the job's uid must reach it), and writable by
    the session (its pid file)."""
    d = Path(tempfile.mkdtemp(prefix="lark-sshd-", dir="/tmp"))
    os.chmod(d, 0o1777)
    sshd = d / "fake-sshd"
    sshd.write_text(FAKE_SSHD)
    sshd.chmod(0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def session_config(tag: str) -> str:
    return f"/var/lib/condor/execute/dir_1/scratch/.condor_ssh_to_job_{tag}/sshd_config"


def test_a_session_runs_in_the_jobs_namespace_as_its_user_without_capabilities(fakehost_factory, bin_dir):
    host = fakehost_factory(ssh_sshd=str(bin_dir / "fake-sshd"))
    p = spawn_hostile(host, "slot1", ["netns", "ssh-session", session_config("1")],
                      job_ad="ClusterId = 71\nProcId = 0")
    out, err = p.communicate(timeout=90)
    answers = results(out)["ssh-session"][-1]["answers"]
    assert answers[0]["ok"] and answers[0]["started"], (answers, err)
    assert answers[1] == {"lark": 1, "ok": True, "exit_code": 7}, answers
    session = next(line for line in out.splitlines() if line.startswith("SESSION"))
    fields = dict(part.split("=", 1) for part in session.split()[1:] if "=" in part)
    job_ns = results(out)["netns"][-1]["netns"]
    assert fields["netns"] == job_ns and fields["uid"] == "65534", session
    assert "CapEff:0000000000000000" in session and "NoNewPrivs:1" in session, session
    assert session.endswith(f"args=-i -e -f {session_config('1')}"), session


def test_the_session_ends_when_the_asker_is_killed(fakehost_factory, bin_dir):
    host = fakehost_factory(ssh_sshd=str(bin_dir / "fake-sshd"))
    tag = "linger" + secrets.token_hex(3)
    p = spawn_hostile(host, "slot1", ["ssh-session", session_config(tag)], job_ad="ClusterId = 72\nProcId = 0")
    pid_file = bin_dir / f"sshd-.condor_ssh_to_job_{tag}.pid"
    deadline = time.time() + 60
    while not pid_file.exists() and time.time() < deadline and p.poll() is None:
        time.sleep(0.1)
    assert pid_file.exists(), p.communicate(timeout=30)
    sshd_pid = int(pid_file.read_text())
    asker = [int(x) for x in sh(["pgrep", "-f", f"hostile_job.py ssh-session {session_config(tag)}"]).stdout.split()]
    assert asker, "the asking job process is not running"
    for pid in asker:
        os.kill(pid, signal.SIGKILL)        # what the starter does to end a session
    deadline = time.time() + 30
    while os.path.exists(f"/proc/{sshd_pid}") and time.time() < deadline:
        time.sleep(0.1)
    assert not os.path.exists(f"/proc/{sshd_pid}"), "larkd left the session running after its asker was killed"
    p.communicate(timeout=60)


def test_what_a_session_leaves_running_goes_when_the_job_ends(fakehost_factory, bin_dir):
    """A session's processes are not the starter's to track (larkd started them): a `setsid` one outlives the
    session, and larkd kills it when the job ends."""
    host = fakehost_factory(ssh_sshd=str(bin_dir / "fake-sshd"))
    p = spawn_hostile(host, "slot1", ["ssh-session", session_config("leftover1")],
                      job_ad="ClusterId = 73\nProcId = 0")
    out, err = p.communicate(timeout=90)
    assert results(out)["ssh-session"][-1]["answers"][1]["exit_code"] == 7, (out, err)
    leftover = int((bin_dir / "leftover.pid").read_text())
    deadline = time.time() + 30
    while os.path.exists(f"/proc/{leftover}") and time.time() < deadline:
        time.sleep(0.1)
    assert not os.path.exists(f"/proc/{leftover}"), "a process a session left ran on after its job ended"
    # larkd logs the kill after it: the process can be gone (reaped) before the line is written.
    while "killed 1 process(es) its ssh sessions left" not in host.larkd_log() and time.time() < deadline + 10:
        time.sleep(0.1)
    assert "killed 1 process(es) its ssh sessions left" in host.larkd_log()


PRELOAD_C = r"""
#include <fcntl.h>
#include <stdio.h>
#include <unistd.h>
__attribute__((constructor)) static void report(void) {
    int fd = open("MARKS", O_WRONLY | O_APPEND | O_CREAT, 0666);
    if (fd >= 0) { dprintf(fd, "%d\n", (int)geteuid()); close(fd); }
}
"""


def test_the_jobs_environment_reaches_the_session_but_never_larkds_root_helpers(fakehost_factory, bin_dir):
    """The session's environment is the asker's (/proc/<pid>/environ): a job chooses it. With LD_PRELOAD in it,
    the root helpers that join the namespace and drop privileges (nsenter, setpriv) would run the job's code as
    root; only the session's program, as the job's user, gets it."""
    marks = bin_dir / "marks"
    src = bin_dir / "preload.c"
    src.write_text(PRELOAD_C.replace("MARKS", str(marks)))
    lib = bin_dir / "preload.so"
    sh(["gcc", "-shared", "-fPIC", "-o", str(lib), str(src)])
    lib.chmod(0o755)
    host = fakehost_factory(ssh_sshd=str(bin_dir / "fake-sshd"))
    host.publish_ad("slot1", "ClusterId = 74\nProcId = 0")
    argv = host.job_argv("slot1", ["ssh-session", session_config("env1")])
    argv[argv.index(str(HERE / "workload.py"))] = HOSTILE
    argv.insert(argv.index("env") + 1, f"LD_PRELOAD={lib}")
    argv.insert(argv.index("env") + 1, "LARK_SESSION_MARK=from-the-job")
    cp = sh(argv, check=False, timeout=90)
    answers = results(cp.stdout)["ssh-session"][-1]["answers"]
    assert answers[1]["exit_code"] == 7, (cp.stdout, cp.stderr)
    assert "mark=from-the-job" in cp.stdout, cp.stdout          # the session has the job's environment
    euids = marks.read_text().split()
    assert euids and "65534" in euids, euids                     # the preload ran, as the job's user
    assert "0" not in euids, f"the job's LD_PRELOAD ran as root in larkd's session helpers: {euids}"


@pytest.fixture
def job_cgroup():
    """A memory cgroup of the test's own, below the test's, standing for the one HTCondor puts a job in."""
    own = next(line.split(":", 2)[2].strip() for line in open("/proc/self/cgroup") if ":memory:" in line)
    base = Path("/sys/fs/cgroup/memory") / own.lstrip("/")
    if not (base / "cgroup.procs").exists():
        pytest.skip("no cgroup v1 memory hierarchy at /sys/fs/cgroup/memory")
    d = base / f"lark-test-{secrets.token_hex(3)}"
    d.mkdir()
    yield d, f"{own.rstrip('/')}/{d.name}"
    for _ in range(100):   # empty once the job and its session have ended
        try:
            d.rmdir()
            break
        except OSError:
            time.sleep(0.1)


def test_a_session_runs_in_the_jobs_cgroup_not_larkds(fakehost_factory, bin_dir, job_cgroup):
    """A job could ask for sessions itself (its own sshd config, its own descriptors) and run processes there: in
    larkd's cgroup they would escape the limits HTCondor puts on the job's and its kill at the job's end."""
    d, path = job_cgroup
    host = fakehost_factory(ssh_sshd=str(bin_dir / "fake-sshd"))
    host.publish_ad("slot1", "ClusterId = 75\nProcId = 0")
    argv = host.job_argv("slot1", ["ssh-session", session_config("cg1")])
    argv[argv.index(str(HERE / "workload.py"))] = HOSTILE
    cp = sh(["sh", "-c", f'echo $$ > {d}/cgroup.procs && exec "$@"', "sh", *argv], check=False, timeout=90)
    answers = results(cp.stdout)["ssh-session"][-1]["answers"]
    assert answers[1]["exit_code"] == 7, (cp.stdout, cp.stderr)
    session = next(line for line in cp.stdout.splitlines() if line.startswith("SESSION"))
    assert f"cg={path} " in session, (session, path)


def test_nobody_but_a_jobs_process_gets_a_session(fakehost_factory, bin_dir):
    host = fakehost_factory(ssh_sshd=str(bin_dir / "fake-sshd"))
    # root (e.g. a confused admin tool): sessions run as the job's user only
    answer = root_request(host, "ssh_session", argv=["/usr/sbin/sshd", "-i", "-e", "-f", session_config("1")])
    assert not answer["ok"] and "not root" in answer["error"], answer
    # a local user outside any job, in the host's namespace
    req = json.dumps({"lark": 1, "op": "ssh_session",
                      "argv": ["/usr/sbin/sshd", "-i", "-e", "-f", session_config("2")]})
    cp = sh(host.in_host(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", JOB_PY, "-c",
                          "import socket,sys;s=socket.socket(socket.AF_UNIX);s.connect(sys.argv[1]);"
                          "s.sendall(sys.argv[2].encode()+b'\\n');print(s.makefile().readline())",
                          host.cfg.socket, req]))
    answer = json.loads(cp.stdout)
    assert not answer["ok"] and "only a process of a job" in answer["error"], answer
    assert not list(bin_dir.glob("sshd-*.pid")), "a session program ran for a refused request"
