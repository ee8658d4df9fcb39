"""One exception type whose message always says what failed, on what, and what to do."""
from __future__ import annotations


class LarkError(Exception):
    held = False  # larkd's answer said it put the job on hold at its schedd (a setup that failed after PREPARE_JOB)

    def __init__(self, what: str, *, job: str | None = None, obj: str | None = None, fix: str | None = None):
        self.what = what
        self.job = job
        self.obj = obj
        self.fix = fix
        super().__init__(self.render())

    def render(self) -> str:
        parts = []
        if self.job:
            parts.append(f"job {self.job}")
        if self.obj:
            parts.append(self.obj)
        head = ": ".join(parts)
        msg = f"{head}: {self.what}" if head else self.what
        if self.fix:
            msg += f" ({self.fix})"
        return msg


class DaemonUnreachable(LarkError):
    """larkd could not be reached at all (no socket, refused, died mid-answer): worth a short retry."""


class DaemonBusy(DaemonUnreachable):
    """larkd refused the connection for now (too many open from the same party): retry after a pause."""
