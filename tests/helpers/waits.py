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
            with open(os.path.join(d, name)) as f:
                s = json.load(f)
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
