"""Waiting for larkd's asynchronous results in integration tests."""
import json
import os
import time


def finished(host, job_id: str, timeout: float = 10) -> dict:
    """The final accounting larkd writes when the starter exits."""
    d = os.path.join(host.cfg.state_dir, "finished")
    deadline = time.time() + timeout
    while time.time() < deadline:
        for name in sorted(os.listdir(d)):
            if not name.endswith(".json"):
                continue  # a temp file of an atomic write in progress
            try:
                with open(os.path.join(d, name)) as f:
                    s = json.load(f)
            except FileNotFoundError:
                continue
            if s["job_id"] == job_id:
                return s
        time.sleep(0.05)
    raise AssertionError(f"no final accounting for job {job_id} in {os.listdir(d)}")


def wait_ready(host, slot: str, timeout: float = 15) -> dict:
    """The status entry of the slot's job once its network is ready."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        for j in host.status():
            if j.get("slot") == slot and j.get("phase") == "ready":
                return j
        time.sleep(0.05)
    raise AssertionError(f"{slot} never became ready:\n{host.larkd_log()}")


def assert_transfers_limited(host, slot: str, cluster: int, mbit: int, world_ip: str, size: int = 3_000_000):
    """A job downloads then uploads `size` bytes with `Bandwidth = mbit` allocated; neither direction may
    beat the limit. A lower bound on time only: a slow machine makes it slower, never faster."""
    (host.www / f"{size}.bin").write_bytes(b"\0" * size)
    ad = f"ClusterId = {cluster}\nProcId = 0"
    host.publish_ad(slot, ad, f"Bandwidth = {mbit}")
    p = host.spawn_job(slot, ["timed-download-upload", f"http://{world_ip}:8000/{size}.bin", world_ip, "7001",
                              str(size)], job_ad=ad)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 0, err + host.larkd_log()
    r = json.loads(out)
    assert r["downloaded"] == r["uploaded"] == size
    floor = size * 8 / (mbit * 1e6) * 0.9
    assert r["down_s"] >= floor and r["up_s"] >= floor, r
    return r


def wait_for(cond, timeout: float = 15.0) -> bool:
    """True as soon as cond() is, False if it never was within `timeout` seconds (polled every 0.2 s)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        if cond():
            return True
        time.sleep(0.2)
    return False
