"""File-transfer jobs on a Lark execution point (issue 22): they run once, their files move, their figures land.

Jobs here are shaped like a pool without a shared filesystem: local inputs, a URL input, output files sent back
to the submit directory or uploaded to an `output_destination`. Each job's event log must show exactly one start
(`history` checks it): an eviction loop that ends in a good exit code still fails the test.
"""
import hashlib
import os
import secrets
import time

import pytest

from condor import SUBMITTED, as_root, as_user, history, job, starts, submit, testbed, wait_queue

import eventlog  # noqa: E402 (testbed/, put on the path by condor)

pytestmark = pytest.mark.e2e

# The job downloads 10 MB itself (counted by Lark) as its last act, so the figures in its history come from the
# exit barrier and not from a periodic push.
FETCH_LAST = ('import hashlib, urllib.request; '
              'data = open("in.bin", "rb").read(); '
              'open("result.bin", "wb").write(hashlib.sha256(data).digest() * 32768); '
              'n = len(urllib.request.urlopen("http://{world}:8000/10M.bin").read()); '
              'print(len(data), n)')


def script_job(name: str, extra: str, inputs: tuple[str, ...] = ("in.bin",)) -> tuple[int, bytes]:
    d = testbed.ROOT / "home/alice" / name
    d.mkdir(parents=True, exist_ok=True)
    data = os.urandom(1_000_000)
    (d / "in.bin").write_bytes(data)
    script = FETCH_LAST.format(world=testbed.WORLD_IP)
    return submit(name, job(args="-c '" + script.replace('"', '""') + "'", inputs=inputs, extra=extra)), data


def test_local_and_url_inputs_and_outputs_run_once_with_final_figures(pool):
    url = f"http://{testbed.WORLD_IP}:8000/50M.bin"
    c, data = script_job("ft-local", "transfer_output_files = result.bin", inputs=("in.bin", url))
    code, mode, inbytes, starts_count = history(c, ["ExitCode", "LarkNetworkType", "NetworkIncomingBytes",
                                                    "NumJobStarts"], timeout=180)
    assert (code, mode, starts_count) == ("0", "nat", "1")
    # The job's own download, its last act, is in the history: the wrapper's barrier held the job until larkd
    # had pushed. So is the URL input (50 MB), fetched by HTCondor's plugin in the job's network.
    assert 60_000_000 <= int(inbytes) < 60_600_000
    d = testbed.ROOT / "home/alice/ft-local"
    assert (d / "out.txt").read_text().split() == ["1000000", "10000000"]
    assert (d / "result.bin").read_bytes() == hashlib.sha256(data).digest() * 32768
    assert not (d / "50M.bin").exists()  # inputs stay on the execution point


def test_output_destination_upload_runs_once(pool):
    tag = secrets.token_hex(4)
    dest = f"http://{testbed.WORLD_IP}:8000/up/{tag}/"
    c, data = script_job("ft-dest", f"transfer_output_files = result.bin\noutput_destination = {dest}")
    code, inbytes = history(c, ["ExitCode", "NetworkIncomingBytes"], timeout=180)
    assert code == "0" and int(inbytes) >= 10_000_000
    uploaded = testbed.CACHE / "www/up" / tag
    deadline = time.time() + 10
    while not (uploaded / "result.bin").exists() and time.time() < deadline:
        time.sleep(0.5)
    assert (uploaded / "result.bin").read_bytes() == hashlib.sha256(data).digest() * 32768
    # The job's stdout is not an output file: it comes back to the submit directory.
    assert (testbed.ROOT / "home/alice/ft-dest/out.txt").read_text().split() == ["1000000", "10000000"]


def test_a_submitters_own_transfer_plugin_is_refused_at_submit(pool):
    """It would run as the job's user with the execution point's network (55-lark-access-point.conf)."""
    d = testbed.ROOT / "home/alice/ft-plugin"
    d.mkdir(parents=True, exist_ok=True)
    (d / "evil.sh").write_text("#!/bin/sh\nip addr > /tmp/evil-saw-the-host\n")
    (d / "evil.sh").chmod(0o755)
    with pytest.raises(RuntimeError, match="LarkOwnPlugins|transfer_plugins"):
        submit("ft-plugin", job(exe="/bin/true", inputs=("evil://host/x",),
                                extra="transfer_plugins = evil=evil.sh"))


def test_doctor_finds_no_job_exit_hook_and_no_url_transfer_gap_with_the_shipped_plugins(pool):
    cp = as_root(["lark", "doctor"])
    assert "JOB_EXIT   ok" in cp.stdout, cp.stdout
    # The shipped FILETRANSFER_PLUGINS are Lark's wrapper and data_plugin: only the sandbox transfer is left.
    line = next(x for x in cp.stdout.splitlines() if x.startswith("transfer"))
    assert "transfer   ok" in line and "sandbox transfer" in line, cp.stdout
    assert "plugins not run in the job's network" not in line, cp.stdout


HOOK_CONF = "etc/condor/config.d/99-test-trivial-job-exit-hook.conf"


def test_htcondor_evicts_file_transfer_jobs_when_any_job_exit_hook_is_configured(pool):
    """The upstream behaviour that moved Lark's barrier into the wrapper (docs/design.md, "The exit barrier"), in its
    smallest form: a JOB_EXIT hook that only reads its stdin, and a job with one input and one output file. The
    starter exits as soon as the hook returns (StarterHookMgr.cpp, HookJobExitClient::hookExited calls
    StarterExit), during output transfer, so the job is evicted and started again. When this test fails, HTCondor
    has fixed it."""
    hook = testbed.ROOT / "usr/local/bin/trivial-job-exit-hook"
    hook.write_text("#!/bin/sh\ncat >/dev/null\nexit 0\n")
    hook.chmod(0o755)
    conf = testbed.ROOT / HOOK_CONF
    conf.write_text("LARK_HOOK_JOB_EXIT = /usr/local/bin/trivial-job-exit-hook\n")
    c = None
    try:
        assert as_root(["condor_reconfig"]).returncode == 0
        time.sleep(2)
        d = testbed.ROOT / "home/alice/ft-hook"
        d.mkdir(parents=True, exist_ok=True)
        (d / "in.txt").write_text("x\n")
        c = submit("ft-hook", job(exe="/bin/cp", args="in.txt result.txt", inputs=("in.txt",)))
        deadline = time.time() + 120
        seen: dict = {}
        while time.time() < deadline:
            seen = starts(c)
            if seen.get(0, []).count("execute") >= 2:
                break
            time.sleep(2)
        events = seen.get(0, [])
        assert events.count("execute") >= 2 and set(events) - {"execute"}, seen
    finally:
        conf.unlink(missing_ok=True)
        as_root(["condor_reconfig"])
        if c is not None:
            as_user(["condor_rm", str(c)])
            deadline = time.time() + 60
            while time.time() < deadline and as_root(["condor_q", str(c), "-af", "ProcId"]).stdout.strip():
                time.sleep(1)


def test_sandbox_transfer_of_100_mb_each_way_is_in_the_jobs_history(pool):
    """Input and output through the shadow: HTCondor's BytesRecvd / BytesSent count them per job (Lark's Network*
    figures are the job's own traffic: none here). docs/user.md says which is which."""
    d = testbed.ROOT / "home/alice/ft-sandbox"
    d.mkdir(parents=True, exist_ok=True)
    size = 100_000_000
    with open(d / "big.in", "wb") as f:
        f.truncate(size)  # sparse on the submit side; every byte still crosses the wire
    c = submit("ft-sandbox", job(exe="/bin/sh", args="-c 'head -c 100000000 /dev/urandom > big.out; wc -c < big.in'",
                                 inputs=("big.in",), extra="transfer_output_files = big.out"))
    code, recvd, sent, inbytes, outbytes = history(c, ["ExitCode", "BytesRecvd", "BytesSent", "NetworkIncomingBytes",
                                                       "NetworkOutgoingBytes"], timeout=240)
    assert code == "0"
    assert (d / "out.txt").read_text().strip() == str(size)
    assert (d / "big.out").stat().st_size == size
    assert size <= float(recvd) < size * 1.01 and size <= float(sent) < size * 1.01, (recvd, sent)
    assert int(inbytes) < 100_000 and int(outbytes) < 100_000  # the job itself used no network
    (d / "big.out").unlink()


# HTCondor's starter (daemon_core.cpp, CreateProcessForkit::fork) writes two pids into a pipe it creates only for
# CLONE_NEWPID; a process cloned with CLONE_NEWNET alone (NO_JOB_NETWORKING, and condor_ssh_to_job's sshd, which
# never gets a PID namespace) has them written to an uninitialised descriptor. Usually that is fd 0 and the write
# lands in /dev/null; when it is not a writable descriptor the starter dies with this message and the job restarts.
# docs/admin.md, "Known HTCondor defects".
STARTER_PIPE_DEFECT = 'ERROR "Unable to write into pipe."'
SSH_ATTEMPTS = 4   # a CI run saw the defect twice in a row (06:04:05, 06:04:17), on consecutive starters of one job


def starter_log_sizes() -> dict:
    return {f: f.stat().st_size for f in (testbed.ROOT / "var/log/condor").glob("StarterLog.slot*")}


def starter_hit_pipe_defect(before: dict) -> bool:
    """Whether a starter logged HTCondor's pipe defect since `before` (starter_log_sizes())."""
    for f in (testbed.ROOT / "var/log/condor").glob("StarterLog.slot*"):
        with open(f, "rb") as fh:
            fh.seek(before.get(f, 0) if f.stat().st_size >= before.get(f, 0) else 0)
            if STARTER_PIPE_DEFECT.encode() in fh.read():
                return True
    return False


def test_condor_ssh_to_job_lands_in_the_jobs_own_network(pool):
    """The starter runs the session's sshd in a fresh empty netns of its own (NO_JOB_NETWORKING) through Lark's
    wrapper, which has larkd run it in the job's namespace instead (lark/daemon/ssh_session.py): the session sees
    the job's interfaces and never the host's uplink, runs as the job's user, and the job it visits keeps running
    and finishes.
    The job runs until the test puts a file in its scratch directory (at most 4 minutes), not for a fixed time: on
    a loaded machine a fixed 25 s ran out while the session was still connecting ("Connection closed").
    HTCondor's own defect (STARTER_PIPE_DEFECT) can kill the starter as it starts the sshd; the job then starts
    again. The test then tries again (SSH_ATTEMPTS in all), and only an eviction with that exact starter message is
    let through: every other restart, and any other failure of the session, still fails it; when every attempt
    met the defect, the test is skipped with it named."""
    c = submit("ssh-nat", job(exe="/bin/sh", args="-c 'i=0; while [ ! -e stop ] && [ $i -lt 240 ]; do sleep 1; "
                                                   "i=$((i+1)); done'"))
    defect_hits = 0
    for _attempt in range(SSH_ATTEMPTS):
        wait_queue(c, ["JobStatus"], lambda r: r[0] == "2", timeout=180)
        before = starter_log_sizes()
        cp = as_user(["condor_ssh_to_job", "-auto-retry", str(c),
                      "cat /proc/net/dev; echo NETNS $(readlink /proc/self/ns/net); echo UID $(id -u)"])
        if cp.returncode == 0 or not starter_hit_pipe_defect(before):
            break
        defect_hits += 1
        if defect_hits == SSH_ATTEMPTS:
            # Lark's part (larkd's session in the job's namespace) was never reached; it is also covered without
            # HTCondor by tests/integration/test_ssh_session_in_job_net.py.
            as_user(["condor_rm", str(c)])
            pytest.skip(f"HTCondor's starter died starting the session's sshd {defect_hits} times "
                        f"({STARTER_PIPE_DEFECT}; docs/admin.md, 'Known HTCondor defects')")
        # the starter died: wait for the job's next start before the next session
        deadline = time.time() + 180
        while time.time() < deadline and starts(c).get(0, []).count("execute") < 1 + defect_hits:
            time.sleep(2)
    assert cp.returncode == 0, cp.stderr
    session_devices = {line.split(":")[0].strip() for line in cp.stdout.splitlines()
                       if ":" in line and "|" not in line and not line.startswith(("NETNS", "UID"))}
    # the job's shell ("[e] stop" does not match the command line of the sh that runs pgrep)
    job_pid = as_root(["pgrep", "-n", "-f", "[e] stop"]).stdout.strip()
    job_ns = as_root(["readlink", f"/proc/{job_pid}/ns/net"]).stdout.strip()
    job_dev = as_root(["cat", f"/proc/{job_pid}/net/dev"]).stdout
    job_devices = {line.split(":")[0].strip() for line in job_dev.splitlines() if ":" in line and "|" not in line}
    host_ns = as_root(["readlink", "/proc/self/ns/net"]).stdout.strip()
    session_ns = cp.stdout.split("NETNS", 1)[1].split()[0].strip()
    assert job_ns.startswith("net:") and job_ns != host_ns, (job_ns, host_ns)
    assert session_ns == job_ns, (session_ns, job_ns)
    assert session_devices == job_devices and "up0" not in session_devices, (session_devices, job_devices)
    assert cp.stdout.split("UID", 1)[1].split()[0] == as_root(["id", "-u", "alice"]).stdout.strip(), cp.stdout
    where = eventlog.last_execute(SUBMITTED[c] / "log.txt", f"{c}.0")
    assert where is not None and where.scratch, "the job's execute event names no scratch directory"
    (testbed.ROOT / where.scratch.lstrip("/") / "stop").touch()
    code, mode = history(c, ["ExitCode", "LarkNetworkType"], timeout=120, once=defect_hits == 0)
    assert (code, mode) == ("0", "nat")
    # a restart is allowed only for each starter the defect killed, and nothing else ended a run
    assert starts(c).get(0, []).count("execute") == 1 + defect_hits, starts(c)
