"""Where the benchmarks' fake execution points keep larkd's run_dir and state_dir: on tmpfs (/dev/shm), as
/run/lark is on an execution point (docs/admin.md). On this VM /tmp and even /run are ext4, where replacing one
state file costs ~2 ms instead of ~0.06 ms, so a run_dir under /tmp made every setup look ~1 ms slower than on a
real host."""
from __future__ import annotations

import os
import tempfile

RUN_FS = "/dev/shm"


def tmpfs_dir(prefix: str) -> str:
    """A new private directory on tmpfs (or under the default temporary directory where there is no /dev/shm)."""
    return tempfile.mkdtemp(prefix=prefix, dir=RUN_FS if os.path.isdir(RUN_FS) else None)
