"""End to end through a real HTCondor pool (testbed/testbed.py): submit, run, read condor_history."""
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "testbed"))
import testbed  # noqa: E402

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def pool():
    testbed.build()
    testbed.install()
    testbed.start()
    yield testbed
    testbed.stop()


def as_alice(argv, cwd="/home/alice"):
    return subprocess.run(testbed.in_root(["sh", "-c", 'cd "$0" && exec "$@"', cwd, *argv], user="alice"),
                          capture_output=True, text=True, timeout=120)


def history(cluster, attrs, timeout=120):
    deadline = time.time() + timeout
    while time.time() < deadline:
        cp = as_alice(["condor_history", str(cluster), "-af", *attrs])
        if cp.stdout.strip():
            return cp.stdout.split()
        time.sleep(2)
    raise AssertionError(f"job {cluster} not in history after {timeout} s")


def submit(pool, name, body):
    d = testbed.ROOT / "home/alice" / name
    d.mkdir(exist_ok=True)
    (d / "job.sub").write_text(body)
    subprocess.run(["chroot", str(testbed.ROOT), "chown", "-R", "alice:alice", f"/home/alice/{name}"], check=True)
    cp = as_alice(["condor_submit", "-terse", "job.sub"], cwd=f"/home/alice/{name}")
    assert cp.returncode == 0, cp.stderr
    return int(cp.stdout.split(".")[0])


def test_default_job_gets_nat_and_history_has_its_bytes(pool):
    size = 10_000_000
    cluster = submit(pool, "nat", f"""executable = /usr/bin/python3
arguments = "-c 'import urllib.request; print(len(urllib.request.urlopen(""http://{testbed.WORLD_IP}:8000/10M.bin"").read()))'"
output = out.txt
error = err.txt
log = log.txt
should_transfer_files = NO
queue
""")
    mode, addr, inbytes, code = history(cluster, ["LarkNetworkType", "LarkIPv4Address", "NetworkIncomingBytes",
                                                  "ExitCode"])
    assert (mode, code) == ("nat", "0")
    assert addr.startswith("10.213.0.")
    # IP bytes counted include HTTP and TCP/IP headers: at least the file, at most 2% more.
    assert size <= int(inbytes) < size * 1.02
