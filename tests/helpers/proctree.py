"""A real process tree for the starter walk: a root-owned "starter" and its child "job"."""
from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def starter_with_job(tmp_path: Path, slot: str = "slot1_3") -> Iterator[tuple[int, int, str]]:
    """(starter pid, job pid, starter path): a copy of sh, so /proc/PID/exe names it, started as
    `condor_starter -f -a <slot>` with a `sleep` child. Both are ended by PID on exit."""
    fake_starter = tmp_path / "condor_starter"
    shutil.copy("/bin/sh", fake_starter)
    starter = subprocess.Popen([str(fake_starter), "-c", "sleep 30 & echo $!; wait", "-f", "-a", slot],
                               stdout=subprocess.PIPE, text=True)
    job_pid = None
    try:
        assert starter.stdout is not None
        job_pid = int(starter.stdout.readline())
        yield starter.pid, job_pid, str(fake_starter)
    finally:
        if job_pid:
            os.kill(job_pid, signal.SIGKILL)  # the "job" is ours too: end it by PID, not left to run
        starter.kill()
        starter.wait()
