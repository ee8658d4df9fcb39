"""condor_ssh_to_job sessions in the job's network (lark/daemon/ssh_session.py, lark/job/ssh_session.py): what
larkd accepts as a session's command, how it takes the session's descriptors, and the wrapper's fallback."""
import os
import subprocess
import sys
import time

import pytest

from lark.daemon import ssh_session
from lark.errors import LarkError
from lark.job import ssh_session as wrapper_side

CONFIG = "/var/lib/condor/execute/dir_1/scratch/.condor_ssh_to_job_1/sshd_config"


def test_the_starters_sshd_command_is_accepted_and_always_runs_this_hosts_sshd():
    cmd = ssh_session.session_command(["/some/where/sshd", "-i", "-e", "-f", CONFIG])
    argv = ssh_session.as_job_user("/run/lark/netns/slot1", 1000, 1000, 3, cmd.program("/usr/sbin/sshd"))
    assert argv[argv.index("--", 2) + 1].endswith("setpriv")
    assert argv[-5:] == ["/usr/sbin/sshd", "-i", "-e", "-f", CONFIG]   # not the requester's program path
    for flag in ("--net=/run/lark/netns/slot1", "--reuid=1000", "--regid=1000", "--init-groups", "--inh-caps=-all",
                 "--bounding-set=-all", "--no-new-privs"):
        assert flag in argv


@pytest.mark.parametrize("argv", [
    ["/bin/sh", "-i", "-e", "-f", CONFIG],                               # another program
    ["/usr/sbin/sshd", "-D", "-e", "-f", CONFIG],                        # another mode
    ["/usr/sbin/sshd", "-i", "-e", "-f", CONFIG, "-o", "x"],             # more options
    ["/usr/sbin/sshd", "-i", "-e", "-f", "/etc/ssh/sshd_config"],        # not the starter's configuration
    ["/usr/sbin/sshd", "-i", "-e", "-f", "relative/.condor_ssh_to_job_1/sshd_config"],
    ["/usr/sbin/sshd", "-i", "-e", "-f", "/x/.condor_ssh_to_job_1/../../etc/ssh/sshd_config"],
    "sshd -i -e -f " + CONFIG,                                           # not a list
    ["/usr/sbin/sshd", "-i", "-e", "-f", 7],
])
def test_anything_but_the_starters_sshd_is_refused(argv):
    with pytest.raises(LarkError, match="ssh_session|sshd"):
        ssh_session.session_command(argv)


def test_take_fds_duplicates_another_processes_descriptors():
    r, w = os.pipe()
    child = subprocess.Popen([sys.executable, "-c", "import sys, time; sys.stdout.write('hi'); sys.stdout.flush(); "
                              "time.sleep(30)"], stdin=subprocess.DEVNULL, stdout=w, stderr=subprocess.DEVNULL)
    os.close(w)
    pidfd = os.pidfd_open(child.pid)
    try:
        taken = ssh_session.take_fds(pidfd, (1,))
        try:
            assert os.read(r, 2) == b"hi"
            os.write(taken[0], b"larkd")                 # the same pipe as the child's stdout
            assert os.read(r, 5) == b"larkd"
            assert not os.get_inheritable(taken[0])      # close-on-exec: no other child of larkd gets it
        finally:
            for fd in taken:
                os.close(fd)
        with pytest.raises(LarkError, match="descriptor 99"):
            ssh_session.take_fds(pidfd, (1, 99))       # and the one it did take is closed again
    finally:
        os.close(pidfd)
        child.kill()
        child.wait()
        os.close(r)


def test_environment_of_reads_the_process_start_environment():
    child = subprocess.Popen(["sleep", "30"], env={"A": "1", "B": "x=y", "PATH": "/usr/bin:/bin"})
    try:
        # the kernel sets a new program's environment just after the exec that Popen waits for: read until set
        deadline = time.monotonic() + 10
        while not ssh_session.environment_of(child.pid) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert ssh_session.environment_of(child.pid) == {"A": "1", "B": "x=y", "PATH": "/usr/bin:/bin"}
    finally:
        child.kill()
        child.wait()


def test_the_wrapper_runs_the_sshd_itself_when_larkd_is_away(tmp_path, monkeypatch, capfd):
    monkeypatch.setenv("LARK_SOCKET", str(tmp_path / "nobody.sock"))
    assert wrapper_side.run_in_job_network(["/usr/sbin/sshd", "-i", "-e", "-f", CONFIG]) is None
    assert "ssh session without the job's network" in capfd.readouterr().err
