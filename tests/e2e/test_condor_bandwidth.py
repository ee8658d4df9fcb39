"""Bandwidth is an allocatable machine resource: matchmaking and partitionable slots enforce the total."""
import time

import pytest

from condor import as_root, history, job, out_of, queue_attrs, submit, testbed

pytestmark = pytest.mark.e2e


def machine_bandwidth() -> int:
    cp = as_root(["condor_status", "-af", "TotalSlotBandwidth"])
    return int(float(cp.stdout.split()[0]))


def test_request_above_machine_bandwidth_never_matches(pool):
    total = machine_bandwidth()
    c = submit("bw-toobig", job(exe="/bin/true", extra=f"request_bandwidth = {total + 1}"))
    time.sleep(12)  # several negotiation cycles
    assert queue_attrs(c, ["JobStatus"]) == ["1"]  # idle: never matched
    as_root(["condor_rm", str(c)])


def test_two_jobs_exceeding_bandwidth_together_never_overlap(pool):
    total = machine_bandwidth()
    each = total // 2 + 1
    c = submit("bw-pair", job(exe="/bin/sleep", args="6", extra=f"request_bandwidth = {each}", count=2))
    rows = history(c, ["ProcId", "JobCurrentStartExecutingDate", "CompletionDate", "ExitCode", "RequestBandwidth",
                       "LarkNetworkType"], timeout=180, procs=2)
    spans = sorted((int(r[1]), int(r[2])) for r in rows)
    assert all(r[3] == "0" and r[5] == "nat" for r in rows), rows
    assert spans[0][1] <= spans[1][0], f"jobs overlapped: {spans}"


def test_two_jobs_within_bandwidth_run_together(pool):
    total = machine_bandwidth()
    each = total // 2 - 1
    c = submit("bw-fit", job(exe="/bin/sleep", args="30", extra=f"request_bandwidth = {each}", count=2))  # outlasts staggered starts
    rows = history(c, ["JobCurrentStartExecutingDate", "CompletionDate"], timeout=180, procs=2)
    spans = sorted((int(r[0]), int(r[1])) for r in rows)
    assert spans[1][0] < spans[0][1], f"jobs that fit together did not overlap: {spans}"


def test_allocated_bandwidth_limits_the_job_and_lands_in_history(pool):
    mbit, size = 50, 10_000_000
    url = f"http://{testbed.WORLD_IP}:8000/10M.bin"
    script = (f'import time, urllib.request; t = time.time(); n = len(urllib.request.urlopen("{url}").read()); '
              'print(n, time.time() - t)')
    c = submit("bw-limit", job(args="-c '" + script.replace('"', '""') + "'", extra=f"request_bandwidth = {mbit}"))
    limit, inbytes, code = history(c, ["LarkBandwidthLimit", "NetworkIncomingBytes", "ExitCode"])
    assert (limit, code) == (str(mbit), "0")
    assert int(inbytes) >= size
    n, seconds = out_of("bw-limit").split()
    assert int(n) == size
    # A lower bound only: the transfer cannot beat its limit (1.6 s at 50 Mbit/s); a slow VM is just slower.
    assert float(seconds) >= size * 8 / (mbit * 1e6) * 0.9
