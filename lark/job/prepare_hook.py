"""lark-prepare-job: the PREPARE_JOB hook. A pre-flight check before the job process exists.

HTCondor 25.x ignores $_CONDOR_WRAPPER_ERROR_FILE (seen with 25.14.1: the file is written, the starter never
reads it, and the job just completes with the wrapper's exit code). A failing PREPARE_JOB hook, on the other
hand, puts the job on hold with the hook's HookStatusMessage as HoldReason (HoldReasonCode 19, subcode =
HookStatusCode). So everything that can be known before the job starts -- larkd reachable, the job's ads
readable, the policy decidable -- is checked here, and a failure holds the job with one readable line.

What runs as LARK_HOOK_PREPARE_JOB is the setgid launcher lark/job/launcher/prepare_job.c (`lark install-hook`):
it does this module's common path itself, with no interpreter start (issue 27): larkd's check, retried as
call_patiently() retries, and the same hold ad byte for byte. It execs this hook, with the job ad it read on stdin,
only for what it cannot reproduce exactly (a lark.toml that could move the socket, an answer that is not plain
ASCII JSON, a hold text that is not plain printable ASCII, ...); tests/unit/test_prepare_job_c.py runs both on
the same cases. A change to what this hook prints needs the same change there.
"""
from __future__ import annotations

import os
import sys

from ..errors import DaemonUnreachable, LarkError
from .client import call_patiently
from .nodump import nondumpable

STATUS_UNREACHABLE = 111   # HoldReasonSubCode: larkd not running on the execution point (transient: released)
STATUS_REFUSED = 112       # HoldReasonSubCode: larkd refused (policy error, unreadable ads, ...): stays held


def classad_string(text: str) -> str:
    """An old-syntax ClassAd string literal (what HTCondor parses hook output as): one printable line, `\\"`
    for quotes.
    Backslashes become `/`: old syntax keeps them literal, so one before the closing quote would escape it."""
    printable = "".join(c if c.isprintable() else " " for c in text.replace("\\", "/"))
    one_line = " ".join(printable.split())
    return '"' + one_line.replace('"', '\\"') + '"'


def hold_ad(code: int, reason: str) -> str:
    return f"HookStatusCode = {code}\nHookStatusMessage = {classad_string('Lark: ' + reason)}\n"


def main(argv: list[str] | None = None) -> int:
    # Runs as the job's user in the host's namespace: no process of that user may trace it. Started by the setgid
    # launcher it never was dumpable; started directly, this closes it from here on (lark/job/nodump.py).
    nondumpable()
    if not sys.stdin.isatty():
        sys.stdin.read()  # the starter writes the job ad to our stdin
    try:
        wait = float(os.environ.get("LARK_PREFLIGHT_WAIT", "10"))
    except ValueError:
        wait = 10.0
    try:
        call_patiently("check", wait=wait, timeout=30)
    except DaemonUnreachable as e:
        # Usually transient: condor_master restarts a dead larkd within ~20 s, and the access point's shipped
        # SYSTEM_PERIODIC_RELEASE_LarkTransient releases such holds. So the reason says that, not "start larkd".
        e.fix = ("usually transient: condor_master restarts larkd and the job is released again automatically; "
                 "if it stays held, check the execution point's LarkdLog and condor_on -daemon LARKD")
        sys.stdout.write(hold_ad(STATUS_UNREACHABLE, f"job not started: {e.render()}"))
        return 1
    except LarkError as e:
        sys.stdout.write(hold_ad(STATUS_REFUSED, f"job not started, its network was refused: {e}"))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
