"""Hooks run as the job's user in the host's network namespace: no other process of that user may trace them.

A process of the same uid may ptrace another (where yama is absent, as on this project's test kernel) unless the
target is not dumpable; a traced hook would be the job's way into the host's namespace, outside its limits and
filter. `prctl(PR_SET_DUMPABLE, 0)` closes that for the rest of the hook's life. The interpreter's start, before
this runs, stays open to a tracer that wins the race: `kernel.yama.ptrace_scope = 1`, or HTCondor's
USE_PID_NAMESPACES = True (jobs then cannot see the hook's pid at all), closes it; `lark doctor` says which
applies (docs/design.md, "Threat model").
"""
from __future__ import annotations

PR_SET_DUMPABLE = 4


def nondumpable() -> bool:
    """Make this process untraceable by processes of its own uid; False if the kernel refused."""
    try:
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False
