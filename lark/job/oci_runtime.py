"""lark-oci-runtime: the OCI runtime dockerd runs docker-universe containers with on a Lark execution point
(issue 25, docs/design.md "Docker universe jobs").

Registered with dockerd as `lark` (daemon.json "runtimes", or `dockerd --add-runtime lark=PATH`); lark-docker adds
`--runtime=lark` to every container it creates with `--network=none`. containerd's shim runs it as it would runc:
`lark-oci-runtime --root R --log L --log-format json create --bundle DIR --pid-file FILE ... ID`.

- `create`: runs the real runc create with the same arguments (the container's init then exists in its own, empty
  network namespace, blocked until `start`), reads the init's pid from --pid-file and asks larkd (`docker_setup`:
  the container id and that pid) to build the job's network in that namespace. It returns only when larkd answered:
  containerd runs `start` after it, so the job's program starts on a ready network. If larkd refuses (or is away),
  the container is deleted (`runc delete --force`) and the runtime exits 1 with Lark's reason on stderr and in
  runc's log (containerd reports that log's last error): the job does not run without its network.
- every other subcommand (start, state, kill, delete, features, ...) is the real runc's: exec'd, not a child, so
  signals and exit codes are runc's own.
The real runc is LARK_REAL_RUNC (environment), else /usr/sbin/runc. It imports only the standard library and
Lark's job side (tests/unit/test_job_boundary.py).
"""
from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import time
from collections.abc import Sequence

from ..errors import LarkError
from . import client, docker_wrapper

log = logging.getLogger("lark.oci-runtime")
DEFAULT_REAL_RUNC = "/usr/sbin/runc"
EXIT_REFUSED = 1
# runc's global options that take a value (before the subcommand); the others are flags.
GLOBAL_WITH_VALUE = frozenset({"--root", "--log", "--log-format", "--criu", "--rootless"})
# How long the runtime waits for larkd to come back (condor_master restarts it) and then for its answer: a setup
# asks the startd and the schedd for the job's ads, as a vanilla job's wrapper does.
LARKD_WAIT_S = 30.0
LARKD_TIMEOUT_S = 60.0


def real_runc() -> str:
    return os.environ.get("LARK_REAL_RUNC") or DEFAULT_REAL_RUNC


def split_command(argv: Sequence[str]) -> tuple[list[str], str | None, list[str]]:
    """(runc's global options, the subcommand, its arguments)."""
    return docker_wrapper.split_command(argv, GLOBAL_WITH_VALUE)


def option(args: Sequence[str], name: str) -> str | None:
    """The value of `--name V` or `--name=V` (runc also takes `-name`), None when absent."""
    names = (name, name[1:]) if name.startswith("--") else (name,)
    for i, word in enumerate(args):
        flag, eq, value = word.partition("=")
        if flag in names:
            if eq:
                return value
            return args[i + 1] if i + 1 < len(args) else None
    return None


def container_id(args: Sequence[str]) -> str | None:
    """The container id: create's last argument."""
    return args[-1] if args and not args[-1].startswith("-") else None


def read_pid(path: str) -> int:
    with open(path) as f:
        text = f.read().strip()
    if not text.isdigit() or int(text) <= 1:
        raise LarkError(f"the pid file holds {text[:20]!r}, not a process id", obj=path,
                        fix="the real runc (LARK_REAL_RUNC) must be runc or a runtime that writes --pid-file")
    return int(text)


def log_error(glob: Sequence[str], message: str) -> None:
    """The refusal into runc's --log, where containerd reads a failed runtime's last error from (json, as runc
    writes it), and on stderr."""
    print(message, file=sys.stderr, flush=True)
    path = option(glob, "--log")
    if not path:
        return
    line = (json.dumps({"level": "error", "msg": message, "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())})
            if option(glob, "--log-format") == "json" else f"level=error msg={message!r}")
    try:
        with open(path, "a") as f:
            f.write(line + "\n")
    except OSError as e:
        log.warning("cannot write runc's log %s: %s", path, e)


def create(glob: list[str], args: list[str]) -> int:
    """runc create, then larkd builds the job's network in the init's namespace; on refusal the container goes."""
    runc = real_runc()
    cid = container_id(args)
    pid_file = option(args, "--pid-file")
    # The shim's descriptors (the container's stdio) go to runc as they came: not closed, not replaced.
    code = subprocess.run([runc, *glob, "create", *args], close_fds=False).returncode
    if code != 0 or cid is None:
        return code   # runc said why (stderr and its log); nothing of the job's network exists yet
    try:
        if not pid_file:
            raise LarkError("create has no --pid-file: larkd cannot find the container's network namespace",
                            obj=f"container {cid}", fix="run lark-oci-runtime only from dockerd/containerd")
        pid = read_pid(pid_file)
        answer = client.call_patiently("docker_setup", wait=LARKD_WAIT_S, timeout=LARKD_TIMEOUT_S, container=cid,
                                       pid=pid)
    except (LarkError, OSError) as e:
        deleted = subprocess.run([runc, *glob, "delete", "--force", cid], close_fds=False,
                                 stdout=subprocess.DEVNULL).returncode
        left = "" if deleted == 0 else (f"; runc delete --force {cid} failed ({deleted}): the created container "
                                        "stays until dockerd removes it")
        log_error(glob, f"Lark: the docker job's network could not be set up, so it does not run: "
                        f"{' '.join(str(e).split())}{left}")
        return EXIT_REFUSED
    plan = answer.get("plan") or {}
    log.info("container %s: network %s %s", cid[:12], plan.get("network_type"), plan.get("ipv4") or "-")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=logging.WARNING, format="lark-oci-runtime: %(message)s")
    glob, sub, args = split_command(argv)
    if sub == "create":
        return create(glob, args)
    return docker_wrapper.exec_real([real_runc(), *argv], "real OCI runtime", "LARK_REAL_RUNC")


if __name__ == "__main__":
    sys.exit(main())
