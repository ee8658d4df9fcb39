"""larkd's Prometheus endpoint and node totals on a fake EP: a real job moves bytes, a real HTTP client scrapes."""
import json
import os
import time

from prometheus_client.parser import text_string_to_metric_families

from helpers.fakehost import HERE, JOB_PY, WORLD_IP, sh
from helpers.waits import finished, wait_ready, wait_until

ADDRESS = "127.0.0.1:9813"   # in the fake host's own netns: nothing else listens there


def scrape(host) -> dict:
    """(sample name, sorted labels) -> value, fetched over HTTP from inside the host netns (where larkd is)."""
    code = f"import urllib.request; print(urllib.request.urlopen('http://{ADDRESS}/metrics', timeout=5).read().decode())"
    text = sh(host.in_host([JOB_PY, "-c", code])).stdout
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def value(samples: dict, name: str, **labels) -> float | None:
    return samples.get((name, tuple(sorted((k, str(v)) for k, v in labels.items()))))


def series(samples: dict, name: str) -> list:
    return [k for k in samples if k[0] == name]


def as_job_user(host, op: str) -> dict:
    """Ask larkd as an unprivileged process that is not a job (uid nobody, in the host netns)."""
    code = (f"import json; from lark.job.client import call; from lark.errors import LarkError\n"
            f"try: print(json.dumps(call({op!r}, path={host.cfg.socket!r})))\n"
            f"except LarkError as e: print(json.dumps({{'error': str(e)}}))")
    cp = sh(host.in_host(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "env",
                          f"PYTHONPATH={HERE.parent.parent}", JOB_PY, "-c", code]))
    return json.loads(cp.stdout)


def test_metrics_follow_a_real_job_and_forget_it_when_it_ends(fakehost_factory):
    host = fakehost_factory(metrics_address=ADDRESS, bandwidth_mbit=1000)
    size = 8_000_000
    (host.www / "m.bin").write_bytes(os.urandom(size))
    before = scrape(host)
    assert value(before, "lark_active_jobs") == 0
    assert series(before, "lark_job_info") == []
    free_pools = {k: v for k, v in before.items() if k[0] == "lark_pool_free"}
    assert free_pools and all(v > 0 for v in free_pools.values())

    ad = 'ClusterId = 41\nProcId = 0\nOwner = "alice"\nGlobalJobId = "sub#41.0#1"'
    host.publish_ad("slot1", ad, "Bandwidth = 200")
    # The job stays until the test has seen what it needs (a fixed sleep was a window a loaded machine can miss).
    done = host.tmp / "metrics-seen"
    spawned = time.monotonic()
    job = host.spawn_job("slot1", ["download-then-await", f"http://{WORLD_IP}:8000/m.bin", str(done)], job_ad=ad)
    assert json.loads(job.stdout.readline())["downloaded"] == size
    wait_ready(host, "slot1")
    ready_within = time.monotonic() - spawned
    # Counters are polled every 0.5 s: wait until a poll saw the whole download.
    seen: dict = {}

    def whole_download_polled() -> bool:
        seen.clear()
        seen.update(scrape(host))
        return (value(seen, "lark_job_bytes_total", slot="slot1", direction="in") or 0) >= size
    wait_until(whole_download_polled, f"a poll to count the job's {size} bytes", detail=lambda: str(seen))
    now = seen
    got = value(now, "lark_job_bytes_total", slot="slot1", direction="in")
    assert size <= got < size * 1.05, got
    status = {j["slot"]: j for j in host.status()}["slot1"]["usage"]
    assert got == status["bytes_in"]
    assert value(now, "lark_job_bytes_total", slot="slot1", direction="out") == status["bytes_out"] > 0
    assert value(now, "lark_job_packets_total", slot="slot1", direction="in") == status["packets_in"] > 0
    assert value(now, "lark_job_limit_bps", slot="slot1") == 200e6
    assert value(now, "lark_job_info", slot="slot1", job_id="41.0", global_job_id="sub#41.0#1",
                 network_type="nat", owner="alice", accounting_group="") == 1
    assert value(now, "lark_active_jobs") == 1
    assert value(now, "lark_setup_seconds_count", network_type="nat") == 1
    # In seconds, and only the setup's own time: no more than the test saw from spawning the job to its being ready.
    assert 0 < value(now, "lark_setup_seconds_sum", network_type="nat") <= ready_within
    used_one = {k: v for k, v in now.items() if k[0] == "lark_pool_free" and free_pools[k] - v == 1}
    assert len(used_one) == 1, (free_pools, now)   # the job holds one address of the NAT pool

    # Node totals for the machine ad: what any local user may see, and nothing about a job.
    lines = dict(l.split(" = ") for l in host.lark("machine-ad").stdout.splitlines())
    assert lines["LarkActiveJobs"] == "1" and int(lines["LarkBytesIn"]) == got
    uplink = float(host.lark("detect-bandwidth").stdout.split("=")[1])   # what larkd knows of the uplink
    assert float(lines["LarkAvailBandwidth"]) == uplink - 200
    totals = as_job_user(host, "totals")
    assert set(totals) == {"lark", "ok", "active_jobs", "bytes_in", "bytes_out", "avail_bandwidth_mbit", "at"}, totals
    # The same user may not read per-job status, and the refusal is counted.
    assert "error" in as_job_user(host, "status")

    done.touch()
    assert job.wait(60) == 0, job.stderr.read() + host.larkd_log()
    s = finished(host, "41.0")
    assert s["global_job_id"] == "sub#41.0#1" and s["rate_limit_mbit"] == 200
    after: dict = {}

    def job_forgotten() -> bool:
        after.clear()
        after.update(scrape(host))
        return not series(after, "lark_job_info")
    wait_until(job_forgotten, "the ended job's series to leave /metrics", detail=lambda: str(after))
    assert series(after, "lark_job_bytes_total") == []
    assert value(after, "lark_active_jobs") == 0
    assert value(after, "lark_teardown_seconds_count") == 1
    assert value(after, "lark_failures_total", reason="refused") == 1
    assert value(after, "lark_failures_total", reason="setup") == 0
    assert {k: v for k, v in after.items() if k[0] == "lark_pool_free"} == free_pools


def test_metrics_off_by_default_and_bad_address_refused(fakehost_factory):
    import pytest
    from lark.config import Config
    from lark.errors import LarkError
    assert Config().metrics_address == ""
    with pytest.raises(LarkError) as e:
        Config(metrics_address="9813").validate()
    assert "metrics_address" in str(e.value)
    host = fakehost_factory()
    code = "import socket; socket.create_connection(('127.0.0.1', 9813), timeout=2)"
    assert sh(host.in_host([JOB_PY, "-c", code]), check=False).returncode != 0
