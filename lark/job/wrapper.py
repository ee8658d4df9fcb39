"""lark-job-wrapper: HTCondor's USER_JOB_WRAPPER. Get the job its network, then become the job.

The job never runs without the network it asked for: on any failure the wrapper exits 111 (EXIT_NO_NETWORK) with
the reason on stderr and in $_CONDOR_WRAPPER_ERROR_FILE. HTCondor 25.x does not act on that file, so the job's
hold comes from the PREPARE_JOB hook (prepare_hook.py), which checks everything knowable before the job starts;
what is left here is a failure between that check and the setup (larkd dying in that window, address pool
exhausted), where the job ends with exit code 111 and the reason in its stderr.
"""
from __future__ import annotations

import os
import sys

from .client import call_patiently
from ..errors import LarkError

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
        answer = call_patiently("setup", wait=20, timeout=timeout)
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
