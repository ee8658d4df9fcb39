"""lark-starter: HTCondor's STARTER. Execs the real condor_starter, with every job in an empty netns.

`-classad` (the startd asking what the starter can do) runs the real starter unchanged, so HasJobNetworking
stays True, and adds Lark's own capability attributes. Every other invocation gets NO_JOB_NETWORKING, so the
starter clones the job into an empty network namespace for larkd to plumb.

Before that exec it asks larkd (`sandbox_limit`) to limit the sandbox transfer: larkd moves this process (the
starter-to-be: exec keeps the pid) into a cgroup of its own, whose sockets it polices at the slot's Bandwidth
(lark/daemon/sandbox.py). Fail open: when larkd is away or refuses, one line goes to stderr and the starter starts
anyway, since a starter that does not start sends the job back through matchmaking (the job's own network still
waits for larkd in lark-job-wrapper). LARK_SANDBOX_LIMIT=false in the starter's environment skips the question;
larkd's knob of the same name, off, answers it at once.

The compiled lark-starter (lark/job/launcher/starter.c; 50-lark.conf's LARK_STARTER chooses one of the two) does
the common path without this interpreter and hands every other case (`-classad` among them) to this one. The real
starter is $LARK_REAL_STARTER when set, else HTCondor's LARK_REAL_STARTER: this one reads it at every start, the
compiled one once, when `lark install-hook` builds it, and passes it to this one in $LARK_REAL_STARTER, so the two
run the same starter; after changing LARK_REAL_STARTER, run `lark install-hook` again.
"""
from __future__ import annotations

import os
import subprocess
import sys

from .. import __version__
from ..errors import LarkError
from .client import call

DEFAULT_REAL = "/usr/sbin/condor_starter"
SANDBOX_ASK_TIMEOUT = 5.0  # s: larkd answers after a cgroup move; the policers follow in its background


def real_starter() -> str:
    explicit = os.environ.get("LARK_REAL_STARTER")
    if explicit:
        return explicit
    try:
        cp = subprocess.run(["condor_config_val", "LARK_REAL_STARTER"], capture_output=True, text=True, timeout=10)
        if cp.returncode == 0 and cp.stdout.strip():
            return cp.stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        pass
    return DEFAULT_REAL


def network_types() -> list[str]:
    """The types larkd's configuration offers, from `lark network-types` in this interpreter: the configuration
    and kernel code stay on larkd's side of the boundary (lark/job/ imports only protocol and errors). The
    startd runs `-classad` rarely; a config error must not take HasJobNetworking away with it."""
    # The same lark package as this one (-I: not one in the startd's working directory or $PYTHONPATH).
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    code = f"import sys; sys.path.insert(0, {root!r}); from lark.cli import main; sys.exit(main(['network-types']))"
    try:
        cp = subprocess.run([sys.executable, "-I", "-c", code], capture_output=True, text=True, timeout=60)
        types = cp.stdout.strip().split(",") if cp.returncode == 0 else []
    except (OSError, subprocess.TimeoutExpired):
        types = []
    return types if types and all(types) else ["nat", "none"]


def slot_of(argv: list[str]) -> str | None:
    """The startd runs `condor_starter -f [-local-name X] -a <slot> [<startd address>]` (-a: the slot's name)."""
    for i, arg in enumerate(argv[:-1]):
        if arg == "-a":
            return argv[i + 1]
    return None


def ask_sandbox_limit(argv: list[str]) -> dict | None:
    """larkd's answer to `sandbox_limit` for this starter, or None (not asked, or failed open: said on stderr)."""
    if os.environ.get("LARK_SANDBOX_LIMIT", "").strip().lower() in ("0", "false", "no", "off"):
        return None
    slot = slot_of(argv)
    if slot is None:
        return None   # not a job's starter (e.g. -version): nothing moves a sandbox
    try:
        return call("sandbox_limit", timeout=SANDBOX_ASK_TIMEOUT, slot=slot, argv=argv)
    except LarkError as e:
        sys.stderr.write(f"lark-starter: slot {slot}: sandbox transfer not limited to the slot's Bandwidth, the "
                         f"starter starts anyway: {e}\n")
        return None


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    real = real_starter()
    if "-classad" in argv:
        cp = subprocess.run([real, *argv], capture_output=True, text=True)
        sys.stdout.write(cp.stdout)
        if cp.returncode == 0:
            print(f'LarkVersion = "{__version__}"')
            print(f'LarkNetworkTypes = "{",".join(network_types())}"')
        sys.stderr.write(cp.stderr)
        return cp.returncode
    ask_sandbox_limit(argv)
    os.environ["_CONDOR_NO_JOB_NETWORKING"] = "true"
    os.execv(real, [real, *argv])
    return 127  # not reached


if __name__ == "__main__":
    sys.exit(main())
