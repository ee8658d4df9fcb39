"""lark-job-wrapper: HTCondor's USER_JOB_WRAPPER. Get the job its network, then become the job.

The job never runs without the network it asked for: on any failure the wrapper exits non-zero, and under
HTCondor writes the reason to $_CONDOR_WRAPPER_ERROR_FILE, which makes the starter put the job on hold with it.
"""
from __future__ import annotations

import os
import sys

from .client import call
from .errors import LarkError

EXIT_NO_NETWORK = 111


def fail(reason: str) -> int:
    line = f"Lark: job not started, its network could not be set up: {reason}"
    print(line, file=sys.stderr, flush=True)
    err_file = os.environ.get("_CONDOR_WRAPPER_ERROR_FILE")
    if err_file:
        try:
            with open(err_file, "w") as f:
                f.write(line + "\n")
        except OSError:
            pass
    return EXIT_NO_NETWORK


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv:
        print("usage: lark-job-wrapper PROGRAM [ARGS...]", file=sys.stderr)
        return 2
    try:
        timeout = float(os.environ.get("LARK_WRAPPER_TIMEOUT", "60"))
    except ValueError:
        timeout = 60.0
    try:
        answer = call("setup", timeout=timeout)
    except LarkError as e:
        return fail(str(e))
    os.environ.update(answer.get("env", {}))
    try:
        os.execvp(argv[0], argv)
    except OSError as e:
        return fail(f"cannot execute {argv[0]}: {e.strerror}")
    return 0  # not reached


if __name__ == "__main__":
    sys.exit(main())
