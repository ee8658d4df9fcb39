"""Hooks run as the job's user in the host's network namespace: no other process of that user may trace them.

A process of the same uid may ptrace another (where yama is absent, as on this project's test kernel) unless the
target is not dumpable; a traced hook would be the job's way into the host's namespace, outside its limits and
filter. `prctl(PR_SET_DUMPABLE, 0)` closes that for the rest of the hook's life, but only once the interpreter has
started and imported: a same-uid tracer handed the hook's pid attaches before (tests/integration/
test_security_hooks.py wins that race every time on this kernel). The setgid launcher (`lark install-hook`,
lark/job/launcher/prepare_job.c) closes the start too: the hook it execs is never dumpable. This call stays for a
hook started without it; `lark doctor` says which is configured (docs/design.md, "Threat model").
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
