"""larkd's docker_setup (lark/daemon/docker_setup.py): which job a container is, from dockerd's name for it and
the live starter that name points to; every refusal names the job (once known) and the fix. dockerd is a fake
HTTP server on a Unix socket; processes are this test's own."""
from __future__ import annotations

import http.server
import json
import os
import socketserver
import sys
import threading
import urllib.parse

import pytest

from lark.daemon import docker_setup, peercred
from lark.errors import LarkError

CID = "a" * 64
RUNTIMES: dict[str, dict] = {}   # what the fake dockerd reports besides runc (GET /info)
ROOT = peercred.Peer(pid=os.getpid(), uid=0, gid=0)


class _Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True


@pytest.fixture
def dockerd(tmp_path):
    """A fake dockerd API: containers[id] = name; GET /containers/<id>/json answers as dockerd does (404 else)."""
    containers: dict[str, str] = {}

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            url = urllib.parse.urlsplit(self.path)
            if url.path == "/info":
                body = json.dumps({"Runtimes": {"runc": {"path": "runc"}, **RUNTIMES}}).encode()
            else:
                assert url.path == "/containers/json"   # not inspect: dockerd locks the container while it starts
                wanted = json.loads(urllib.parse.parse_qs(url.query)["filters"][0])["id"][0]
                # dockerd's filter matches prefixes: a longer id sharing the prefix is listed too
                body = json.dumps([{"Id": cid, "Names": [name]} for cid, name in containers.items()
                                   if cid.startswith(wanted) or wanted.startswith(cid[:12])]).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):  # a Unix socket has no client address to log
            pass

    path = str(tmp_path / "docker.sock")
    server = _Server(path, Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"unix://{path}", containers
    server.shutdown()
    server.server_close()


def test_htcondors_container_name_is_parsed():
    assert docker_setup.parse_name("/HTCJob12_3_slot1_1_PID4242") == (12, 3, "slot1_1", 4242)
    assert docker_setup.parse_name("HTCJob7_0_slot2_PID99") == (7, 0, "slot2", 99)
    for bad in ("/my-container", "/HTCJob12_3_slot1", "/HTCJobX_3_slot1_PID1", "/xHTCJob1_2_slot1_PID3"):
        with pytest.raises(LarkError, match="not named as HTCondor names"):
            docker_setup.parse_name(bad)


def test_the_name_comes_from_dockerd(dockerd):
    host, containers = dockerd
    containers[CID] = "/HTCJob12_3_slot1_PID4242"
    containers[CID[:12] + "c" * 52] = "/other"    # shares the id's first 12 characters: not this container
    assert docker_setup.container_name(host, CID) == "/HTCJob12_3_slot1_PID4242"
    assert docker_setup.container_name(host, CID[:12] + "c" * 52) == "/other"


def authorize(who, host, cid=CID, pid=None):
    return docker_setup.authorize(who, cid, os.getpid() if pid is None else pid, host, [sys.executable],
                                  netns_inode_of_self(), peercred.own_userns_inode())


def netns_inode_of_self() -> int:
    return os.stat("/proc/self/ns/net").st_ino


def test_a_non_root_asker_is_refused(dockerd):
    host, containers = dockerd
    containers[CID] = "/HTCJob12_3_slot1_PID4242"
    with pytest.raises(LarkError, match="for the root OCI runtime"):
        authorize(peercred.Peer(pid=os.getpid(), uid=1001, gid=1001), host)


def test_an_unknown_container_is_refused_naming_the_socket_and_the_fix(dockerd):
    host, _ = dockerd
    with pytest.raises(LarkError, match="dockerd knows no container aaaaaaaaaaaa") as e:
        authorize(ROOT, host)
    assert "LARK_DOCKER_HOST" in str(e.value)


def test_dockerd_away_is_refused_naming_the_knob(tmp_path):
    with pytest.raises(LarkError, match="cannot ask dockerd") as e:
        authorize(ROOT, f"unix://{tmp_path}/none.sock")
    assert "LARK_DOCKER_HOST" in str(e.value)


@pytest.mark.parametrize("cid, pid", [("../../x", 5), (CID, "5"), (CID, 1), (CID, True)])
def test_malformed_requests_are_refused(dockerd, cid, pid):
    with pytest.raises(LarkError):
        authorize(ROOT, dockerd[0], cid=cid, pid=pid)


def test_a_starter_that_is_not_alive_is_refused_naming_the_job(dockerd):
    host, containers = dockerd
    gone = os.fork()
    if gone == 0:
        os._exit(0)
    os.waitpid(gone, 0)
    containers[CID] = f"/HTCJob12_3_slot1_PID{gone}"
    with pytest.raises(LarkError, match=f"starter \\(pid {gone}\\) named by the container is not running") as e:
        authorize(ROOT, host)
    assert "job 12.3" in str(e.value)


def test_a_live_process_that_is_no_starter_is_refused(dockerd):
    host, containers = dockerd
    containers[CID] = f"/HTCJob12_3_slot1_PID{os.getppid()}"   # pytest's parent: not this Python
    with pytest.raises(LarkError, match="is not a root condor_starter|not running"):
        authorize(ROOT, host)


def test_a_starter_of_another_slot_is_refused(dockerd):
    """This very process stands in for the starter (its exe is sys.executable, a 'starter path' here): its command
    line has no `-a slot1`, so it is not slot1's starter."""
    if os.getuid() != 0:
        pytest.skip("the starter must be root-owned")
    host, containers = dockerd
    containers[CID] = f"/HTCJob12_3_slot1_PID{os.getpid()}"
    with pytest.raises(LarkError, match="runs slot None, not slot1") as e:
        authorize(ROOT, host)
    assert "job 12.3" in str(e.value)


@pytest.mark.parametrize("inside, refusal", [(False, "not the container's process"),
                                             (True, "shares the execution point's network namespace")])
def test_a_pid_outside_the_container_or_in_the_eps_netns_is_refused(dockerd, monkeypatch, inside, refusal):
    """This process stands in for slot1's starter (its command line read as `-a slot1`) and for the container's
    init: not in the container's cgroup; or (cgroup check passed) in the execution point's own netns."""
    if os.getuid() != 0:
        pytest.skip("the starter must be root-owned")
    host, containers = dockerd
    containers[CID] = f"/HTCJob12_3_slot1_PID{os.getpid()}"
    monkeypatch.setattr(peercred, "slot_from_cmdline", lambda argv: "slot1")
    if inside:
        monkeypatch.setattr(docker_setup, "in_container", lambda pid, cid: True)
    with pytest.raises(LarkError, match=refusal) as e:
        authorize(ROOT, host)
    assert "job 12.3" in str(e.value) and "HTCJob12_3_slot1" in str(e.value)


def test_the_job_ad_must_be_the_named_job():
    job = docker_setup.DockerJob(CID, "HTCJob12_3_slot1_PID5", 12, 3, "slot1", None, 9, 1)  # type: ignore[arg-type]
    docker_setup.check_job_ad("12.3", job)
    with pytest.raises(LarkError, match="says job 12.3, but the slot's starter runs job 12.4"):
        docker_setup.check_job_ad("12.4", job)


@pytest.mark.parametrize("registered", [True, False])
def test_doctor_says_whether_dockerd_has_larks_runtime(dockerd, monkeypatch, registered):
    from lark import hostcheck
    from lark.config import Config
    host, _ = dockerd
    if registered:
        monkeypatch.setitem(RUNTIMES, "lark", {"path": "/opt/lark/bin/lark-oci-runtime"})
    run = lambda argv: (0, "/usr/local/libexec/lark-docker\n") if argv[-1] == "DOCKER" else (1, "")  # noqa: E731
    [found] = hostcheck.docker_runtime(run, Config(docker_host=host))
    assert found.ok is registered, found
    if registered:
        assert found.found == "dockerd runtime lark = /opt/lark/bin/lark-oci-runtime"
    else:
        assert "no 'lark' runtime (runc)" in found.found and "daemon.json" in found.fix
    [away] = hostcheck.docker_runtime(run, Config(docker_host="unix:///nonexistent/docker.sock"))
    assert not away.ok and "LARK_DOCKER_HOST" in away.fix
    assert hostcheck.docker_runtime(lambda argv: (1, ""), Config(docker_host=host)) == []  # no DOCKER: no line
