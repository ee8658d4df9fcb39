"""Eight jobs at once: distinct addresses, all succeed, and nothing of Lark is left when the pool drains."""
import json
import time

import pytest

from condor import as_root, history, job, submit, testbed

pytestmark = pytest.mark.e2e


def test_eight_concurrent_jobs_distinct_addresses_and_nothing_left(pool):
    url = f"http://{testbed.WORLD_IP}:8000/10M.bin"
    script = (f'import os, time, urllib.request; n = len(urllib.request.urlopen("{url}").read()); '
              'time.sleep(30); print(os.environ.get("LARK_IPV4_ADDRESS"), n)')
    c = submit("eight", job(args="-c '" + script.replace('"', '""') + "'", extra="output = out.$(Process).txt\nrequest_memory = 64",
                            count=8))
    rows = history(c, ["ProcId", "LarkIPv4Address", "ExitCode", "NetworkIncomingBytes",
                       "JobCurrentStartExecutingDate", "CompletionDate"], timeout=240, procs=8)
    addrs = [r[1] for r in rows]
    assert len(set(addrs)) == 8, addrs
    assert all(r[2] == "0" for r in rows), rows
    assert all(int(r[3]) >= 10_000_000 for r in rows), rows
    # They really ran at the same time (8 cpus): the latest start comes before the earliest end (each runs 30 s, so
    # starts staggered by a loaded machine still overlap).
    assert max(int(r[4]) for r in rows) < min(int(r[5]) for r in rows)
    for r in rows:
        out = (testbed.ROOT / "home/alice/eight" / f"out.{r[0]}.txt").read_text().split()
        assert out == [r[1], "10000000"]

    deadline = time.time() + 60
    while time.time() < deadline:
        st = as_root(["lark", "status", "--json"])
        if st.returncode == 0 and json.loads(st.stdout) == []:
            break
        time.sleep(1)
    else:
        raise AssertionError(f"larkd still has jobs after the pool drained: {st.stdout}")
    gc = as_root(["lark", "gc", "--dry-run"])
    assert gc.returncode == 0, gc.stderr
    assert "nothing" in gc.stdout.lower(), gc.stdout
    links = as_root(["ip", "-o", "link"]).stdout
    assert " lk-" not in links, links
    nft = as_root(["nft", "list", "table", "inet", "lark"]).stdout
    assert "chain j_" not in nft, nft
