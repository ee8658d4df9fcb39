"""lark-hook: the former JOB_EXIT hook, kept so that an old configuration naming it does not stall the starter.

Do not configure it (nor any JOB_EXIT hook): on HTCondor 24.x and 25.x the starter exits as soon as a JOB_EXIT hook
returns, which is before the job's output transfer has finished, so every file-transfer job is evicted and run
again without end (docs/design.md, "The exit barrier"). The barrier now lives in lark-job-wrapper, which stays the
job's parent and asks larkd for the final push when the job's program ends. A starter that cannot spawn a
configured hook waits forever, so removing this program while a configuration still names it would be worse than
keeping it: it does nothing but say, in the StarterLog, what to change. `lark doctor` reports the knob.
"""
from __future__ import annotations

import logging
import sys

log = logging.getLogger("lark-hook")


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.WARNING, format="lark-hook: %(message)s")
    if not sys.stdin.isatty():
        sys.stdin.read()  # the starter writes the job ad to the hook's stdin; do not leave it blocked
    log.warning("obsolete: remove LARK_HOOK_JOB_EXIT from the configuration (a JOB_EXIT hook makes HTCondor's "
                "starter exit during output transfer; lark-job-wrapper holds the exit barrier now)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
