"""Jobs in a PID namespace of their own (HTCondor's USE_PID_NAMESPACES = True with NO_JOB_NETWORKING), on the real
kernel with a fake execution point: tests/helpers/pidns_starter.c clones the job as HTCondor's starter then does
(CLONE_NEWPID|CLONE_NEWNS|CLONE_NEWNET, a /proc of the new namespace). With ad files there is no schedd to push
to, so no exit barrier: lark-job-wrapper execs the program, which is then pid 1 of the namespace (as
condor_pid_ns_init is under HTCondor). larkd, in the host's PID namespace, must still recognise the job by
SO_PEERCRED and its process tree, network it, watch its starter and tear down when that ends.
docs/admin.md, "Known HTCondor defects"."""
import json
import os

import pytest
from helpers.fakehost import HERE, HOST_IP, JOB_PY, WORLD_IP, sh
from helpers.waits import finished

from lark import config as larkconfig

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
