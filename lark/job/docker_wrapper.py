"""lark-docker: HTCondor's DOCKER on a Lark execution point (issue 25, docs/design.md "Docker universe jobs").

The starter runs the docker CLI itself, as the condor user, in the execution point's own network namespace:
`docker create ... --network=X ... --name HTCJob<cluster>_<proc>_<slot>_PID<starter> IMAGE CMD`, then
`docker start -a NAME`, then inspect/rm/kill. NO_JOB_NETWORKING and USER_JOB_WRAPPER do not apply, so Docker
would give the job its own bridge NAT (no `--network`), the host's network (`docker_network_type = host`) or any
network named in DOCKER_NETWORKS: none of them limited, counted or decided by Lark's policy.

This wrapper passes every docker command through to the real CLI (LARK_REAL_DOCKER, with its global options such
as `--host`), but rewrites `create` and `run`:
- no `--network`, `--network=nat|bridge|default|none`: the container is created with `--network=none`, an empty
  network namespace of its own, which is where larkd builds the job's network (design.md);
- `--network=host`, `container:...`, or a network name not in LARK_DOCKER_NETWORKS: refused. The wrapper exits 1
  with the reason as its only stderr line; the starter reads it and puts the job on hold with it;
- port publishing (`-p`, `--publish`, `-P`, `--publish-all`): refused, Docker's own inbound path around Lark's
  rules (it needs a network Docker manages anyway);
- `--privileged`, `--cap-add` of NET_ADMIN, NET_RAW, SYS_ADMIN or ALL (only from the EP's DOCKER_EXTRA_ARGUMENTS):
  refused, and those three are always dropped (`--cap-drop`, also where DOCKER_DROP_ALL_CAPABILITIES = false
  leaves Docker's default set, which has NET_RAW): the job must not hold them over its own network namespace,
  where larkd keeps rules of its own (docs/design.md, "Threat model");
- a network the admin lists in LARK_DOCKER_NETWORKS is passed as asked (Lark does not manage it: a site's choice);
- every container created with `--network=none` also gets `--runtime=lark`: Lark's OCI runtime
  (oci_runtime.py) has larkd build the job's network in the container's namespace before the job starts. A dockerd
  without that runtime refuses the create; the wrapper turns that into a hold reason that says how to register it.
After `docker start -a` of a job's container (as a child), it holds the exit barrier: larkd writes the job's final
figures into its ad before the starter sees the container's end.
It imports only the standard library and Lark's job side (tests/unit/test_job_boundary.py).
"""
from __future__ import annotations

import logging
import os
import re
import shlex
import subprocess
import sys
from collections.abc import Sequence

from ..errors import LarkError

log = logging.getLogger("lark.docker")
DEFAULT_REAL_DOCKER = "/usr/bin/docker"
EXIT_REFUSED = 1
# What HTCondor's `docker_network_type` and Docker's own defaults name: the container gets Lark's network instead.
LARK_NETWORK_NAMES = frozenset({"", "nat", "bridge", "default", "none"})
# docker create/run options that take no value (everything else spelled `--opt` or `-o` takes the next word).
FLAGS = frozenset({"--init", "--rm", "-i", "--interactive", "-t", "--tty", "--privileged", "--read-only", "-d",
                   "--detach", "-P", "--publish-all", "--oom-kill-disable", "--no-healthcheck", "-q", "--quiet",
                   "--disable-content-trust", "--sig-proxy", "--help", "--use-api-socket"})
SHORT_FLAGS = frozenset("itdPq")  # docker create/run's one-letter options without a value
NETWORK_OPTS = ("--network", "--net")
# Capabilities that would let the job undo what larkd keeps in its netns (the DHCP guard, SciTags table; NET_RAW:
# packet sockets that skip netfilter), or leave it: refused in --cap-add, and always dropped.
NET_CAPS = frozenset({"NET_ADMIN", "NET_RAW", "SYS_ADMIN", "ALL"})
DROPPED_CAPS = ("NET_ADMIN", "NET_RAW", "SYS_ADMIN")
PUBLISH_OPTS = ("-p", "--publish", "-P", "--publish-all")
BARRIER_WAIT_S = 20.0  # how long the exit barrier waits for larkd (condor_master restarts it in ~20 s)
RUNTIME = "lark"  # the name lark-oci-runtime is registered under with dockerd
JOB_NAME = re.compile(r"HTCJob(\d+)_(\d+)_")
# docker's global options that take a value (before the subcommand).
GLOBAL_WITH_VALUE = frozenset({"-H", "--host", "-c", "--context", "--config", "-l", "--log-level", "--tlscacert",
                               "--tlscert", "--tlskey"})


class Refused(Exception):
    """A docker create/run this execution point does not run; the message is the job's hold reason."""


def knob(name: str) -> str | None:
    """LARK_* knob from the environment (tests) or HTCondor's configuration (condor_config_val: lark/job/ does
    not import htcondor2); None when undefined."""
    if name in os.environ:
        return os.environ[name]
    try:
        cp = subprocess.run(["condor_config_val", name], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired) as e:
        log.warning("condor_config_val %s: %s", name, e)
        return None
    return cp.stdout.strip() if cp.returncode == 0 else None


def real_docker() -> list[str]:
    return shlex.split(knob("LARK_REAL_DOCKER") or DEFAULT_REAL_DOCKER)


def allowed_networks() -> set[str]:
    return {n for n in re.split(r"[\s,]+", knob("LARK_DOCKER_NETWORKS") or "") if n}


def split_command(argv: Sequence[str], with_value: frozenset[str] = GLOBAL_WITH_VALUE,
                  ) -> tuple[list[str], str | None, list[str]]:
    """(global options, subcommand, its arguments) of a docker command line (of runc's: its `with_value`)."""
    i = 0
    while i < len(argv) and argv[i].startswith("-"):
        i += 2 if argv[i] in with_value else 1
    if i >= len(argv):
        return list(argv), None, []
    return list(argv[:i]), argv[i], list(argv[i + 1:])


def job_of(args: Sequence[str]) -> str:
    """`job C.P` from HTCondor's container name (HTCJob<cluster>_<proc>_...), for the hold reason."""
    for word in args:
        m = JOB_NAME.search(word)
        if m:
            return f"job {m.group(1)}.{m.group(2)}"
    return "docker job"


def is_flag(name: str) -> bool:
    """Whether a create/run option takes no value: a known flag, or short flags grouped (`-it`)."""
    if name in FLAGS:
        return True
    return len(name) > 2 and name[0] == "-" and name[1] != "-" and set(name[1:]) <= SHORT_FLAGS


def rewrite_create(args: Sequence[str], allowed: set[str]) -> list[str]:
    """The arguments of `docker create`/`run` with the network Lark gives the job; Refused for what it refuses.
    Only options before the image are options: the job's own command line after it is never touched."""
    out: list[str] = []
    networks: list[str] = []
    i = 0
    while i < len(args):
        word = args[i]
        if word == "--" or not word.startswith("-"):
            break  # the image: the rest is the job's command
        name, eq, value = word.partition("=")
        if word[1] != "-" and len(word) > 2 and not is_flag(name):
            name, eq, value = word[:2], "=", word[2:].removeprefix("=")  # a short option with its value: -pVALUE
        takes_value = not eq and not is_flag(name)
        if takes_value:
            if i + 1 >= len(args):
                raise Refused(f"{job_of(args)}: docker option {name} has no value")
            value = args[i + 1]
        i += 2 if takes_value else 1
        if name in NETWORK_OPTS:
            networks.append(value)
            continue
        if name == "--privileged" and value.lower() not in ("false", "0"):
            raise Refused(f"{job_of(args)}: Lark refuses a privileged docker container (--privileged): it would see "
                          "the execution point's devices and could leave its network namespace (remove "
                          "--privileged from DOCKER_EXTRA_ARGUMENTS on this execution point)")
        if name == "--cap-add" and {c.strip().upper().removeprefix("CAP_") for c in value.split(",")} & NET_CAPS:
            raise Refused(f"{job_of(args)}: Lark refuses to give a docker container {name} {value}: with it the job "
                          "could remove the rules Lark keeps in its network namespace (remove it from "
                          "DOCKER_EXTRA_ARGUMENTS on this execution point)")
        if name in PUBLISH_OPTS or (is_flag(name) and "P" in name[1:]):
            shown = f"{name} {value}" if takes_value else word
            raise Refused(f"{job_of(args)}: Lark refuses Docker port publishing ({shown}): published ports would "
                          "reach the job past Lark's inbound rules (remove container_service_names from the job)")
        out += [word, value] if takes_value else [word]
    rest = list(args[i:])
    for network in networks:
        if network in LARK_NETWORK_NAMES:
            continue
        if network in allowed:
            continue
        if network == "host":
            what = "the execution point's own network (docker_network_type = host)"
        elif network.startswith("container:"):
            what = f"another container's network ({network})"
        else:
            what = f"the Docker network {network!r}, which Lark does not manage"
        raise Refused(f"{job_of(args)}: Lark refuses to run a docker job in {what}: it would bypass the job's "
                      "own network, limits and accounting (remove docker_network_type from the submit file; an "
                      "admin may allow a named network in LARK_DOCKER_NETWORKS)")
    # Never these in the container, even where DOCKER_DROP_ALL_CAPABILITIES = false leaves Docker's defaults.
    out += [f"--cap-drop={cap}" for cap in DROPPED_CAPS]
    named = [n for n in networks if n not in LARK_NETWORK_NAMES]
    if named:
        log.info("%s: network %s passed as asked (LARK_DOCKER_NETWORKS)", job_of(args), ", ".join(named))
        return [*out, *(f"--network={n}" for n in named), *rest]
    # The job's network is built in the container's own namespace by Lark's OCI runtime (lark-oci-runtime, asking
    # larkd between runc's create and start): registered with dockerd under this name.
    return [*out, "--network=none", f"--runtime={RUNTIME}", *rest]


def unknown_runtime(stderr: str) -> str | None:
    """Lark's hold reason when dockerd refused the create for not knowing Lark's runtime, else None."""
    if "unknown or invalid runtime name" not in stderr and "unknown runtime" not in stderr.lower():
        return None
    name = RUNTIME
    return (f"Lark: this execution point's dockerd has no OCI runtime {name!r}, which builds a docker job's "
            f"network (docker said: {' '.join(stderr.split())[:160]}) (register it: dockerd --add-runtime "
            f"{name}=/opt/lark/bin/lark-oci-runtime, or \"runtimes\" in /etc/docker/daemon.json, then restart "
            "dockerd; docs/admin.md \"Container jobs\")")


def create_through(cmd: list[str]) -> int:
    """docker create/run as a child (stdin and stdout the starter's), its stderr read: a refusal for want of Lark's
    runtime becomes a hold reason that says how to register it; any other stderr is passed on as it came."""
    try:
        proc = subprocess.run(cmd, stderr=subprocess.PIPE, text=True)
    except OSError as e:
        return cannot_run(cmd, "docker CLI", "LARK_REAL_DOCKER", e)
    reason = unknown_runtime(proc.stderr) if proc.returncode else None
    sys.stderr.write(f"{reason}\n" if reason else proc.stderr)
    sys.stderr.flush()
    return proc.returncode


def attached_job(args: Sequence[str]) -> bool:
    """`docker start -a HTCJob...`: the starter waiting on a job's container (its exit is the job's)."""
    return any(a in ("-a", "--attach") or a.startswith("--attach=") for a in args) and any(
        JOB_NAME.match(a) for a in args)


def start_with_barrier(cmd: list[str]) -> int:
    """`docker start -a` as a child (signals forwarded: the starter sees this process as the container's CLI);
    when the container has ended, larkd is asked to write the job's final figures into its ad (the exit barrier,
    as lark-job-wrapper's for a vanilla job), then this ends as the CLI did. The starter waits for it, so the job
    is still in the queue and its history gets these figures."""
    from .client import call_patiently
    from .wrapper import Forwarder, end_like, spawn
    forwarder = Forwarder()
    forwarder.install()
    try:
        child = spawn(cmd, forwarder)
    except OSError as e:
        return cannot_run(cmd, "docker CLI", "LARK_REAL_DOCKER", e)
    _, status = os.waitpid(child, 0)
    forwarder.stop()
    try:
        answer = call_patiently("push", wait=BARRIER_WAIT_S, timeout=30, barrier=True)
        log.info("exit barrier: %s", answer)
    except LarkError as e:   # never fails the job: its history keeps the last periodic figures
        log.warning("the job's final network figures were not written into its ad: %s", e)
    return end_like(status)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=logging.WARNING, format="lark-docker: %(message)s")
    glob, sub, args = split_command(argv)
    if sub in ("create", "run"):
        try:
            args = rewrite_create(args, allowed_networks())
        except Refused as e:
            # The starter holds the job with the first line of this stderr (up to 511 bytes).
            print(f"Lark: {e}", file=sys.stderr, flush=True)
            return EXIT_REFUSED
    cmd = [*real_docker(), *glob, *([sub] if sub else []), *args]
    if sub in ("create", "run") and f"--runtime={RUNTIME}" in args:
        return create_through(cmd)
    if sub == "start" and attached_job(args):
        return start_with_barrier(cmd)
    return exec_real(cmd, "docker CLI", "LARK_REAL_DOCKER")


def cannot_run(cmd: Sequence[str], what: str, knob_name: str, e: OSError) -> int:
    print(f"Lark: the {what} {cmd[0]} ({knob_name}) cannot run: {e}", file=sys.stderr, flush=True)
    return 127


def exec_real(cmd: list[str], what: str, knob_name: str) -> int:
    """Become the real program (its exit code and signals are its own); 127 with the reason if it cannot run."""
    try:
        os.execv(cmd[0], cmd)
    except OSError as e:
        return cannot_run(cmd, what, knob_name, e)
    return 127  # not reached


if __name__ == "__main__":
    sys.exit(main())
