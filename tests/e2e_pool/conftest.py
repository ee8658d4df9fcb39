"""The pool testbed (testbed/pool.py) for the whole session: started once, stopped at the end even when a test or
the start fails. It shares the one-machine testbed's chroot root, so run it (like tests/e2e) under
`flock /tmp/lark-testbed.lock`; the lock is not taken here, as `flock ... make test` already holds it."""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "testbed"))
import pool  # noqa: E402
import pool_probe  # noqa: E402


def pytest_collection_modifyitems(config, items):
    for item in items:
        if "e2e_pool" in str(item.fspath):
            item.add_marker(pytest.mark.e2e)


@pytest.fixture(scope="session")
def lark_pool():
    if os.geteuid() != 0:
        pytest.skip("the pool testbed needs root (namespaces, mounts, chroot)")
    pool.tb.build()
    # tests/e2e's one-machine testbed runs from the same root (its tests come first and are done by now; its own
    # teardown stops it again, which is safe to repeat): the root must not change under a running pool.
    if pool.tb.load_state().get("master_pid"):
        pool.tb.stop()
    pool.tb.install()
    pool.start()  # tears down what it made when it fails
    try:
        yield pool
    finally:
        pool.down()


@pytest.fixture(scope="session")
def controller_status(lark_pool):
    """A function that reads `lark-controller status --json` of the running pool."""
    if not pool.controller_available():
        pytest.skip("lark-controller is not in this tree")

    def read() -> dict:
        cp = pool.controller_cli("status", "--config", str(pool.POOL / "controller.toml"), "--json", check=False)
        assert cp.returncode == 0, cp.stderr
        return json.loads(cp.stdout)
    return read


@pytest.fixture(scope="session")
def policy_run(controller_status):
    """One round of probe jobs for every policy test: jobs of alice, bob and carol on both EPs, each trying every
    other job and the WAN; the controller's view is read while they run."""
    views: dict = {}

    def while_running() -> None:
        views["running"] = controller_status()

    jobs = pool_probe.run_probes(pool_probe.policy_jobs(), run="e2e", while_running=while_running)
    return {j.label: j for j in jobs}, views
