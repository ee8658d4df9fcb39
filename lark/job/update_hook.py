"""lark-hook: the JOB_EXIT hook. A barrier: larkd writes the job's final figures into its ad before it leaves.

Runs as the job's user in the host netns, under the job's starter. It carries no figure: it asks larkd to `push`,
and larkd reads the job's counters and edits the job's ad at its schedd itself, as root (lark/daemon/adpush.py).
The starter waits for this hook, so the job is still in the queue and its history gets those figures. Nothing a
job can change (its chirp configuration, this process) can change what is written; a job that stops this hook
only loses the barrier, and larkd's periodic and final pushes still write its figures.

Until 0.1 this hook chirped the figures (`set_job_attr_delayed`); a job could then forge them through its chirp
configuration or by tracing this process. Configured as UPDATE_JOB_INFO (old configurations) it does nothing:
larkd pushes running jobs' figures on its own. Never fails the job.
"""
from __future__ import annotations

import logging
import sys

from .client import call
from .nodump import nondumpable
from ..errors import LarkError

log = logging.getLogger("lark-hook")


def main(argv: list[str] | None = None) -> int:
    nondumpable()
    argv = list(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=logging.WARNING, format="lark-hook: %(message)s")
    if not sys.stdin.isatty():
        sys.stdin.read()  # the starter writes the job ad to the hook's stdin; do not leave it blocked
    if not argv or argv[0] != "exit":
        return 0   # UPDATE_JOB_INFO: larkd pushes running jobs' figures itself
    try:
        answer = call("push", timeout=30)
    except LarkError as e:
        log.warning("larkd could not push the job's final figures now (its history keeps the last push): %s", e)
        return 0
    if not answer.get("pushed"):
        log.warning("final figures not pushed: %s", answer.get("reason", "the schedd did not take them"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
