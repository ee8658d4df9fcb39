"""Which job a docker-universe container is, for larkd's `docker_setup` (issue 25, docs/design.md "Docker universe
jobs").

lark-oci-runtime (run as root by containerd, after `runc create`) asks with the container's id and its init's pid.
The asker is root, not the job, so everything about the job is found here, not taken from the request:
- the container's name, from dockerd (LARK_DOCKER_HOST): HTCondor names it `HTCJob<cluster>_<proc>_<slot>_PID<starter
  pid>` (the bundle's config.json carries neither the name nor annotations);
- the starter: that pid must be a live root process running a configured starter (LARK_STARTER_PATHS) for that
  slot (its `-a <slot>` argument); its job ad (from the startd, as for a vanilla job) must be `<cluster>.<proc>`;
- the init: the pid must be in the container's cgroup (its path names the container id), in a network namespace
  other than the execution point's and owned by the initial user namespace (a rootless or userns-remapped dockerd
  is refused: the container would hold CAP_NET_ADMIN over its own limits).
"""
from __future__ import annotations

import http.client
import json
import os
import re
import socket
import urllib.parse
from dataclasses import dataclass
from typing import Any

from ..errors import LarkError
from . import peercred

CONTAINER_NAME = re.compile(r"^/?HTCJob(\d+)_(\d+)_(.+)_PID(\d+)$")
CONTAINER_ID = re.compile(r"^[0-9a-f]{12,64}$")
DOCKER_API_TIMEOUT = 10.0


@dataclass
class DockerJob:
    container: str   # the container's id
    name: str        # its name, from dockerd
    cluster: int
    proc: int
    slot: str
    starter: peercred.StarterInfo
    pid: int         # the container's init: the job's pid for its network
    netns: int       # the inode of its network namespace

    @property
    def job_id(self) -> str:
        return f"{self.cluster}.{self.proc}"


def parse_name(name: str) -> tuple[int, int, str, int]:
    """(cluster, proc, slot, starter pid) of HTCondor's container name; LarkError for any other name."""
    m = CONTAINER_NAME.match(name)
    if m is None:
        raise LarkError(f"container {name!r} is not named as HTCondor names a docker job's "
                        "(HTCJob<cluster>_<proc>_<slot>_PID<starter pid>)", obj="docker_setup",
                        fix="use the lark runtime only for containers the condor_starter creates through lark-docker")
    return int(m.group(1)), int(m.group(2)), m.group(3), int(m.group(4))


class _UnixHTTPConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float):
        super().__init__("localhost", timeout=timeout)
        self.path = path

    def connect(self) -> None:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(self.timeout)
        s.connect(self.path)
        self.sock = s


def docker_socket(docker_host: str) -> str:
    if not docker_host.startswith("unix://"):
        raise LarkError(f"LARK_DOCKER_HOST {docker_host!r} is not a unix:// socket", obj="docker_setup",
                        fix="set LARK_DOCKER_HOST to dockerd's socket, e.g. unix:///run/docker.sock")
    return docker_host.removeprefix("unix://")


def api_get(docker_host: str, url: str, about: str, timeout: float = DOCKER_API_TIMEOUT) -> Any:
    """GET `url` from dockerd's API, its JSON answer; LarkError naming the socket and the fix."""
    path = docker_socket(docker_host)
    conn = _UnixHTTPConnection(path, timeout)
    try:
        conn.request("GET", url)
        resp = conn.getresponse()
        body = resp.read()
    except OSError as e:
        raise LarkError(f"cannot ask dockerd about {about}: {e}", obj=path,
                        fix="set LARK_DOCKER_HOST to the socket of the dockerd that runs HTCondor's docker "
                            "jobs") from None
    finally:
        conn.close()
    if resp.status != 200:
        raise LarkError(f"dockerd answered {resp.status} about {about}", obj=path, fix="check dockerd's log")
    try:
        return json.loads(body)
    except ValueError:
        raise LarkError(f"dockerd's answer about {about} is not JSON", obj=path, fix="check dockerd's log") from None


def runtimes(docker_host: str) -> dict[str, Any]:
    """The OCI runtimes dockerd knows (GET /info, "Runtimes"): name -> {"path": ...}."""
    info = api_get(docker_host, "/info", "its runtimes")
    found = info.get("Runtimes") if isinstance(info, dict) else None
    return found if isinstance(found, dict) else {}


def container_name(docker_host: str, cid: str, timeout: float = DOCKER_API_TIMEOUT) -> str:
    """The container's name as dockerd knows it. From its container list filtered by the id (GET /containers/json),
    not from inspect (GET /containers/<id>/json): dockerd holds the container's lock for the whole `start`, whose
    runtime is the one asking, so an inspect would wait for its own caller (seen: timed out); the list reads
    dockerd's in-memory view without that lock."""
    path = docker_socket(docker_host)
    query = urllib.parse.urlencode({"all": "1", "filters": json.dumps({"id": [cid]})})
    listed = api_get(docker_host, f"/containers/json?{query}", f"container {cid[:12]}", timeout)
    try:
        found = [c for c in listed if c.get("Id") == cid]   # the filter matches id prefixes too
    except (TypeError, AttributeError):
        raise LarkError(f"dockerd's answer about container {cid[:12]} is not a container list", obj=path) from None
    if not found:
        raise LarkError(f"dockerd knows no container {cid[:12]}", obj=path,
                        fix="LARK_DOCKER_HOST must name the dockerd the lark runtime is registered with")
    names = found[0].get("Names")
    if not isinstance(names, list) or not names or not isinstance(names[0], str):
        raise LarkError(f"dockerd's answer about container {cid[:12]} has no name", obj=path)
    return names[0]


def starter_of_slot(pid: int, slot: str, starter_paths: list[str], job: str) -> peercred.StarterInfo:
    """The live root starter `pid` of `slot`; LarkError naming the job otherwise."""
    wanted = {os.path.realpath(p) for p in starter_paths}
    try:
        started = peercred.start_time(pid)
        exe = os.readlink(f"/proc/{pid}/exe")
        uid = peercred.real_uid(pid)
        argv = peercred.cmdline(pid)
    except (FileNotFoundError, ProcessLookupError, ValueError, IndexError):
        raise LarkError(f"the starter (pid {pid}) named by the container is not running", job=job,
                        obj=f"starter pid {pid}", fix="none: the job's starter has exited") from None
    if exe not in wanted or uid != 0:
        raise LarkError(f"pid {pid}, named as the job's starter by its container, is not a root condor_starter "
                        f"({exe}, uid {uid})", job=job, obj=f"starter pid {pid}",
                        fix="check LARK_STARTER_PATHS; only containers HTCondor's starter creates are networked")
    found = peercred.slot_from_cmdline(argv)
    if found != slot:
        raise LarkError(f"the starter (pid {pid}) runs slot {found}, not {slot} as its container's name says",
                        job=job, obj=f"starter pid {pid}", fix="none: the container is not that starter's job")
    if not peercred.alive(pid, started):
        raise LarkError("the starter exited while it was read", job=job, obj=f"starter pid {pid}",
                        fix="none: the job is ending")
    return peercred.StarterInfo(pid, started, slot, exe, argv)


def in_container(pid: int, cid: str) -> bool:
    """Whether the process's cgroups are the container's (cgroupfs: .../<id>; systemd: docker-<id>.scope)."""
    try:
        with open(f"/proc/{pid}/cgroup") as f:
            return any(cid in line.rsplit(":", 1)[-1] for line in f)
    except (FileNotFoundError, ProcessLookupError):
        return False


def authorize(who: peercred.Peer, cid: object, pid: object, docker_host: str, starter_paths: list[str],
              daemon_netns: int, daemon_userns: int) -> DockerJob:
    """The docker job the runtime asks about, checked; LarkError naming the job (once known) and the fix."""
    if who.uid != 0:
        raise LarkError("docker_setup is for the root OCI runtime (lark-oci-runtime under containerd) only",
                        obj=f"pid {who.pid} uid {who.uid}", fix="register lark-oci-runtime with dockerd")
    if not isinstance(cid, str) or not CONTAINER_ID.match(cid):
        raise LarkError(f"docker_setup: {str(cid)[:80]!r} is not a container id", obj="docker_setup",
                        fix="lark-oci-runtime passes create's last argument, the container id")
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 1:
        raise LarkError(f"docker_setup: {str(pid)[:20]!r} is not a process id", obj=f"container {cid[:12]}")
    name = container_name(docker_host, cid)
    cluster, proc, slot, starter_pid = parse_name(name)
    job = f"{cluster}.{proc}"
    starter = starter_of_slot(starter_pid, slot, starter_paths, job)
    if not in_container(pid, cid):
        raise LarkError(f"pid {pid} is not the container's process (not in its cgroup)", job=job,
                        obj=f"container {name.lstrip('/')}", fix="lark-oci-runtime passes the pid runc wrote")
    try:
        job_ns, owner = peercred.netns_identity(pid)
    except (FileNotFoundError, ProcessLookupError):
        raise LarkError(f"the container's init (pid {pid}) exited", job=job,
                        obj=f"container {name.lstrip('/')}", fix="none: the container is gone") from None
    if owner != daemon_userns:
        raise LarkError("the container's network namespace is owned by a user namespace of its own (rootless or "
                        "userns-remapped dockerd): the job would hold CAP_NET_ADMIN over its own limits", job=job,
                        obj=f"container {name.lstrip('/')}", fix="run docker jobs on a rootful dockerd without "
                                                                   "userns-remap")
    if job_ns == daemon_netns:
        raise LarkError("the container shares the execution point's network namespace", job=job,
                        obj=f"container {name.lstrip('/')}", fix="lark-docker creates job containers with "
                                                                  "--network=none; use it as DOCKER")
    if not peercred.alive(starter.pid, starter.start):
        raise LarkError("the job's starter exited while the container was checked", job=job,
                        obj=f"starter pid {starter.pid}", fix="none: the job is ending")
    return DockerJob(cid, name.lstrip("/"), cluster, proc, slot, starter, pid, job_ns)


def check_job_ad(plan_job_id: str, job: DockerJob) -> None:
    """The slot's job ad (from the startd) is the job the container's name says."""
    if plan_job_id != job.job_id:
        raise LarkError(f"the container's name says job {job.job_id}, but the slot's starter runs job {plan_job_id}",
                        job=job.job_id, obj=f"container {job.name}",
                        fix="none: the container is not that starter's job")
