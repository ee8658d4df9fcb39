"""Jobs in a PID namespace of their own (HTCondor's USE_PID_NAMESPACES = True with NO_JOB_NETWORKING), on the real
kernel with a fake execution point: tests/helpers/pidns_starter.c clones the job as HTCondor's starter then does
(CLONE_NEWPID|CLONE_NEWNS|CLONE_NEWNET, a /proc of the new namespace). With ad files there is no schedd to push
to, so no exit barrier: lark-job-wrapper execs the program, which is then pid 1 of the namespace (as
condor_pid_ns_init is under HTCondor). larkd, in the host's PID namespace, must still recognise the job by
SO_PEERCRED and its process tree, network it, watch its starter and tear down when that ends.
docs/admin.md, "Known HTCondor defects"."""
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading

import pytest
from helpers.fakehost import HERE, HOST_IP, JOB_PY, WORLD_IP, sh
from helpers.waits import finished

from lark import config as larkconfig
from lark import protocol

# The job's program: who it is in its namespace, what larkd gave it, and whether the world answers it.
PROBE = f"""
import json, os, socket
with socket.create_connection(("{WORLD_IP}", 7000), timeout=5) as s:
    seen = s.recv(100).decode().strip()
print(json.dumps({{"pid": os.getpid(), "ppid": os.getppid(), "pidns": os.readlink("/proc/self/ns/pid"),
                  "address": os.environ.get("LARK_IPV4_ADDRESS"), "seen_as": seen,
                  "visible": sorted(int(p) for p in os.listdir("/proc") if p.isdigit())}}), flush=True)
"""


@pytest.fixture(scope="module")
def pidns_starter(tmp_path_factory):
    d = tmp_path_factory.mktemp("pidns-starter")
    os.chmod(d, 0o755)
    out = str(d / "lark-pidns-starter")
    sh(["gcc", "-O2", "-Wall", "-o", out, str(HERE / "pidns_starter.c")])
    return out


@pytest.fixture
def pidns_host(fakehost_factory, pidns_starter):
    """A fake EP whose larkd knows the PID-namespace starter (and only through its configuration)."""
    host = fakehost_factory()
    host.starter = pidns_starter
    host.cfg.starter_paths.append(pidns_starter)
    host.cfg_path.write_text(larkconfig.dump(host.cfg))
    host.stop_larkd()
    host.start_larkd()
    return host


def job_argv(host, slot: str) -> list[str]:
    env = ["env", f"LARK_SOCKET={host.cfg.socket}", f"PYTHONPATH={HERE.parent.parent}"]
    return host.in_host([host.starter, "-a", slot, "-u", "65534", "--", *env, JOB_PY, "-m", "lark.job.wrapper",
                         JOB_PY, "-c", PROBE])


def test_a_job_that_is_pid_1_of_its_own_pid_namespace_is_networked_watched_and_torn_down(pidns_host):
    host = pidns_host
    host.publish_ad("p1", "ClusterId = 41\nProcId = 0")
    cp = sh(job_argv(host, "p1"), check=False, timeout=120)
    assert cp.returncode == 0, cp.stderr + host.larkd_log()
    seen = json.loads(cp.stdout)
    # The wrapper, exec'd into the program, is the namespace's init: the layout USE_PID_NAMESPACES gives.
    assert (seen["pid"], seen["ppid"]) == (1, 0), seen
    assert seen["pidns"] != os.readlink("/proc/self/ns/pid")
    assert seen["visible"] == [1], seen                    # none of the host's processes (nor Lark's hooks)
    assert seen["address"] and seen["address"].startswith("10.213.0."), seen
    assert seen["seen_as"] == HOST_IP, seen                 # networked through NAT by larkd
    s = finished(host, "41.0")                             # larkd saw the starter end and wrote the final record
    assert s["bytes_out"] > 0 and s["bytes_in"] > 0, s
    assert not any(host.wait_clean().values()), host.residue()


@pytest.fixture
def barrier_larkd():
    """A stand-in larkd that networks nothing but announces an exit barrier, so the wrapper forks the program and
    stays as pid 1 of the job's namespace (what a real larkd with a schedd to push to does); the ops it was asked.
    Its socket is in a directory of /tmp the job's uid can reach (pytest's own are 0700)."""
    d = tempfile.mkdtemp(prefix="lark-pidns-", dir="/tmp")
    os.chmod(d, 0o755)
    path = os.path.join(d, "lark.sock")
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(path)
    os.chmod(path, 0o777)
    srv.listen(8)
    asked: list[str] = []

    def serve() -> None:
        while True:
            try:
                conn, _ = srv.accept()
            except OSError:
                return
            with conn:
                line = conn.makefile("rb").readline()
                asked.append(protocol.parse_request(line)["op"])
                conn.sendall(protocol.ok(env={}, exit_barrier=5.0, pushed=True))

    threading.Thread(target=serve, daemon=True).start()
    yield path, asked
    srv.close()
    shutil.rmtree(d, ignore_errors=True)


def test_a_soft_kill_reaches_the_program_through_the_wrapper_as_pid_1(pidns_starter, barrier_larkd):
    """The kernel drops a signal to a namespace's init that has no handler for it: the wrapper, pid 1 while it holds
    the exit barrier, must still pass the starter's SIGTERM (condor_rm's soft kill) on to the program."""
    path, asked = barrier_larkd
    code = "import os, time; print(os.getpid(), os.getppid(), flush=True); time.sleep(300)"
    p = subprocess.Popen([pidns_starter, "-a", "p2", "-u", "65534", "--", "env", f"LARK_SOCKET={path}",
                          f"PYTHONPATH={HERE.parent.parent}", JOB_PY, "-m", "lark.job.wrapper", JOB_PY, "-c", code],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().split() == ["2", "1"]     # the program, a child of the wrapper as init
        p.send_signal(signal.SIGTERM)                        # the starter forwards it to the job's pid
        _, err = p.communicate(timeout=60)                   # the program sleeps 300 s unless it got it
    finally:
        if p.poll() is None:
            # SIGKILL to the wrapper, the namespace's init, ends every process in it; then the starter.
            with open(f"/proc/{p.pid}/task/{p.pid}/children") as f:
                for pid in f.read().split():
                    os.kill(int(pid), signal.SIGKILL)
            p.kill()
            p.wait(10)
    # The program died of SIGTERM; the wrapper, as init, cannot die of a signal its handler left at the default
    # (the kernel ignores it), so it exits 128 + 15 (under HTCondor condor_pid_ns_init is that program and reports
    # the job's own status to the starter through its status file).
    assert "pidns-starter: job exited 143" in err, err
    assert asked == ["setup", "push"], asked                 # networked first, the barrier's push at the end
