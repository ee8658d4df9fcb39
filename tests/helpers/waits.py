"""Waiting for larkd's asynchronous results in integration tests.

Every wait here has a timeout about three times what the slowest run seen on a loaded 2-core CI machine took
(wait_ready's former 15 s timed out once under `make test` with other work on the machine), and a failure names
what was waited for and what was seen instead. A wait that succeeds returns as soon as its condition holds, so a
generous timeout costs nothing on a passing run.
"""
import json
import os
import time
from collections.abc import Callable

# Typical on an idle machine: a job ready in well under 1 s, its final record within 1 s of the starter's exit;
# under load both have taken several seconds. These are the upper ends, x3.
READY_TIMEOUT = 45.0
FINISHED_TIMEOUT = 30.0
CONDITION_TIMEOUT = 30.0


def finished(host, job_id: str, timeout: float = FINISHED_TIMEOUT) -> dict:
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
    raise AssertionError(f"no final accounting record for job {job_id} within {timeout:.0f} s; {d} holds "
                         f"{os.listdir(d)}\n{host.larkd_log()}")


def wait_ready(host, slot: str, timeout: float = READY_TIMEOUT) -> dict:
    """The status entry of the slot's job once its network is ready."""
    deadline = time.time() + timeout
    seen: list[dict] = []
    while time.time() < deadline:
        seen = host.status()
        for j in seen:
            if j.get("slot") == slot and j.get("phase") == "ready":
                return j
        time.sleep(0.05)
    phases = {j.get("slot"): j.get("phase") for j in seen}
    raise AssertionError(f"the job of {slot} was not ready (its network set up) within {timeout:.0f} s; "
                         f"last status by slot: {phases}\n{host.larkd_log()}")


def assert_transfers_limited(host, slot: str, cluster: int, mbit: int, world_ip: str, size: int = 3_000_000):
    """A job downloads then uploads `size` bytes with `Bandwidth = mbit` allocated; neither direction may
    beat the limit. A lower bound on time only: a slow machine makes it slower, never faster."""
    (host.www / f"{size}.bin").write_bytes(b"\0" * size)
    ad = f"ClusterId = {cluster}\nProcId = 0"
    host.publish_ad(slot, ad, f"Bandwidth = {mbit}")
    p = host.spawn_job(slot, ["timed-download-upload", f"http://{world_ip}:8000/{size}.bin", world_ip, "7001",
                              str(size)], job_ad=ad)
    out, err = p.communicate(timeout=120)
    assert p.returncode == 0, err + host.larkd_log()
    r = json.loads(out)
    assert r["downloaded"] == r["uploaded"] == size
    floor = size * 8 / (mbit * 1e6) * 0.9
    assert r["down_s"] >= floor and r["up_s"] >= floor, r
    return r


def wait_for(cond: Callable[[], object], timeout: float = CONDITION_TIMEOUT) -> bool:
    """True as soon as cond() is, False if it never was within `timeout` seconds (polled every 0.2 s)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        if cond():
            return True
        time.sleep(0.2)
    return False


def wait_until(cond: Callable[[], object], what: str, timeout: float = CONDITION_TIMEOUT,
               detail: Callable[[], str] = lambda: "") -> None:
    """Return as soon as cond() holds; else fail naming `what` was waited for, how long, and detail()."""
    if not wait_for(cond, timeout):
        raise AssertionError(f"waited {timeout:.0f} s for {what}, in vain\n{detail()}")
