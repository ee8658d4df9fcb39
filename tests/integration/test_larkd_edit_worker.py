"""A larkd that pushes figures to schedds starts its edit worker (adpush.EditWorker: htcondor2, which keeps the GIL
while it waits for the schedd, runs there and not in larkd) at its start, and the worker does not outlive larkd,
however larkd ends (issue 27)."""
from __future__ import annotations

import dataclasses
import os
import signal
import time

import pytest

from lark import config as larkconfig


def children(pid: int) -> list[int]:
    out: list[int] = []
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/children") as f:
                out += [int(c) for c in f.read().split()]
        except FileNotFoundError:
            pass
    return out


def cmdline(pid: int) -> list[str]:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return [a.decode() for a in f.read().split(b"\0") if a]
    except FileNotFoundError:
        return []


def edit_worker_of(larkd_pid: int, timeout: float = 10) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for c in children(larkd_pid):
            if cmdline(c)[-2:] == ["lark.daemon.adpush", "--worker"]:
                return c
        time.sleep(0.1)
    raise AssertionError(f"larkd (pid {larkd_pid}) has no edit worker child: {[cmdline(c) for c in children(larkd_pid)]}")


def gone(pid: int, timeout: float = 10) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().split(") ")[1].startswith("Z"):
                    return True   # ended; its parent (larkd, itself gone: init) reaps it
        except FileNotFoundError:
            return True
        time.sleep(0.05)
    return False


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_larkd_starts_its_edit_worker_and_the_worker_ends_with_larkd(fakehost_factory, sig):
    host = fakehost_factory()
    host.stop_larkd()
    # Ads from the startd (none runs here: larkd asks it per job) and pushes to the claims' schedds.
    host.cfg = dataclasses.replace(host.cfg, ad_source="startd", schedd_push_interval=30.0).validate()
    host.cfg_path.write_text(larkconfig.dump(host.cfg))
    host.start_larkd()
    assert host.larkd is not None
    worker = edit_worker_of(host.larkd.pid)
    host.stop_larkd(sig)
    assert gone(worker), f"larkd's edit worker (pid {worker}) still runs after larkd ended by {sig.name}"


def test_no_edit_worker_when_larkd_pushes_to_no_schedd(host):
    assert host.larkd is not None
    time.sleep(1)
    assert not [c for c in children(host.larkd.pid) if "--worker" in cmdline(c)]
