"""The sandbox-transfer limit (lark/daemon/sandbox.py) on the real kernel: a real cgroup v2 and a real nftables table
in a network namespace made here (never the machine's own), real TCP over that namespace's loopback.

The limiter's nft commands all run through a libnftables context made inside the test's netns; its cgroups go under
a parent named for this test run, removed at the end."""
import os
import secrets
import signal
import subprocess
import sys
import time

import pytest

from lark.config import Config
from lark.daemon import peercred
from lark.daemon.sandbox import SandboxLimiter
from lark.kernel.firewall import libnft
from lark.kernel.sandbox_police import CHAINS, Starter, cgroup2_mount

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or cgroup2_mount() is None,
                                reason="needs root and a cgroup v2 mount")

LIMIT_MBIT = 20.0
WINDOW_S = 4.0

SERVER = r"""
import socket, sys, time
mode, port = sys.argv[1], int(sys.argv[2])
ls = socket.socket(); ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); ls.bind(("127.0.0.1", port)); ls.listen(1)
print("ready", flush=True)
c, _ = ls.accept()
if mode == "send":
    buf = b"x" * 65536
    try:
        while True:
            c.sendall(buf)
    except OSError:
        pass
else:
    n, t0 = len(c.recv(1 << 20)), time.monotonic()   # the receiver counts: a sender's count includes its buffer
    while True:
        got = len(c.recv(1 << 20))
        if not got:
            break
        n += got
    print(n, time.monotonic() - t0, flush=True)
"""

# Waits for a line on stdin (the test moves it into its cgroup meanwhile), then moves data for WINDOW s over the one
# connection it makes; as the receiving end it prints the bytes and the seconds from its first byte.
CLIENT = r"""
import socket, sys, time
mode, port, window = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
sys.stdin.readline()
s = socket.create_connection(("127.0.0.1", port))
s.settimeout(window + 5)
buf = b"y" * 65536
if mode == "send":
    t0 = time.monotonic()
    while time.monotonic() - t0 < window:
        s.send(buf)
    s.close()
else:
    n, t0 = len(s.recv(1 << 20)), time.monotonic()
    while time.monotonic() - t0 < window:
        n += len(s.recv(1 << 20))
    print(n, time.monotonic() - t0, flush=True)
"""


@pytest.fixture
def ns():
    name = f"lark-sbx-{secrets.token_hex(3)}"
    subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        subprocess.run(["ip", "-n", name, "link", "set", "lo", "up"], check=True)
        yield name
    finally:
        subprocess.run(["ip", "netns", "del", name], check=False, capture_output=True)


@pytest.fixture
def limiter(ns):
    tag = secrets.token_hex(3)
    fd = os.open(f"/run/netns/{ns}", os.O_RDONLY)
    lim = SandboxLimiter(Config(nft_table=f"lktest{tag}", sandbox_cgroup=f"lark.sandbox.test-{tag}"),
                         nft=lambda cmd: libnft.run_in_netns(fd, cmd))
    procs: list[subprocess.Popen] = []
    lim.test_procs = procs  # type: ignore[attr-defined]
    try:
        yield lim
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait()
        for s in lim.police.cgroups():
            lim.remove(s)
        if os.path.isdir(lim.parent):
            os.rmdir(lim.parent)
        os.close(fd)


def spawn(lim: SandboxLimiter, ns: str, argv: list[str], **kw) -> tuple[subprocess.Popen, Starter]:
    """A process in the test's netns (nsenter execs it: its pid is the one returned)."""
    p = subprocess.Popen(["nsenter", f"--net=/run/netns/{ns}", *argv], **kw)
    lim.test_procs.append(p)  # type: ignore[attr-defined]
    for _ in range(100):  # until nsenter has exec'd the program (same pid, new start time is not an issue)
        if os.readlink(f"/proc/{p.pid}/exe") != os.path.realpath("/usr/bin/nsenter"):
            break
        time.sleep(0.01)
    return p, Starter(p.pid, peercred.start_time(p.pid))


def test_add_check_remove_and_gc_of_an_orphan(limiter, ns):
    p, s = spawn(limiter, ns, ["sleep", "60"])
    path = limiter.join(s)
    assert str(p.pid) in open(os.path.join(path, "cgroup.procs")).read().split()
    limiter.limit(s, "slot1_1", LIMIT_MBIT)
    limiter.limit(s, "slot1_1", LIMIT_MBIT)   # again: replaces, never doubles
    assert limiter.check(s) == []
    whats = limiter.keys()[s]
    assert sorted(whats) == sorted([f"cgroup {path}"] + [f"nft rule in {limiter.table} {c}" for c in CHAINS])
    assert limiter.sweep() == [] and limiter.check(s) == []  # a live starter's limit is not an orphan

    # Removal while a process is still in the cgroup: the policers go, the cgroup stays and is reported.
    errors = limiter.remove(s)
    assert len(errors) == 1 and "still has processes" in errors[0], errors
    assert sorted(limiter.check(s)) == sorted(f"no policer in {limiter.table} {c}" for c in CHAINS)
    p.kill()
    p.wait()
    assert limiter.remove(s) == [] and not os.path.exists(path)
    assert limiter.remove(s) == []   # idempotent

    # An orphan: its starter is gone, larkd never saw it exit. gc finds both pieces and removes them.
    q, o = spawn(limiter, ns, ["sleep", "60"])
    limiter.join(o)
    limiter.limit(o, "slot1_2", LIMIT_MBIT)
    q.kill()
    q.wait()
    assert limiter.sweep(dry_run=True) == [f"sandbox limit of gone starter pid {o.pid}: cgroup "
                                           f"{limiter.cgroup_dir(o)}, nft rule in {limiter.table} sandbox_out, "
                                           f"nft rule in {limiter.table} sandbox_in"]
    assert o in limiter.keys()
    actions = limiter.sweep()
    assert len(actions) == 1 and "incomplete" not in actions[0], actions
    assert limiter.keys() == {} and limiter.sweep() == []

    # `lark gc --purge`: the table in the netns and the cgroups' parent go too; nothing is left to find.
    assert limiter.purge() == [f"nft table inet {limiter.table}", f"cgroup {limiter.parent}"]
    assert not os.path.exists(limiter.parent)
    assert limiter.nft(f"list table inet {limiter.table}")[0] != 0
    assert limiter.purge() == []


@pytest.mark.parametrize("direction", ["upload", "download"])
def test_tcp_from_a_process_in_the_cgroup_is_limited(limiter, ns, direction):
    port = 20000 + secrets.randbelow(20000)
    server_mode, client_mode = ("recv", "send") if direction == "upload" else ("send", "recv")
    server, _ = spawn(limiter, ns, [sys.executable, "-c", SERVER, server_mode, str(port)], stdout=subprocess.PIPE,
                      text=True)
    assert server.stdout is not None and server.stdout.readline().strip() == "ready"
    client, s = spawn(limiter, ns, [sys.executable, "-c", CLIENT, client_mode, str(port), str(WINDOW_S)],
                      stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    limiter.join(s)
    limiter.limit(s, "slot1_1", LIMIT_MBIT)
    assert client.stdin is not None and client.stdout is not None
    client.stdin.write("go\n")
    client.stdin.flush()
    receiver = server if direction == "upload" else client
    assert receiver.stdout is not None
    moved, seconds = receiver.stdout.readline().split()
    client.wait(timeout=30)
    server.send_signal(signal.SIGTERM)
    mbit = int(moved) * 8 / float(seconds) / 1e6
    ratio = mbit / LIMIT_MBIT
    counted = limiter.counters(s)
    print(f"sandbox {direction}: {int(moved)} bytes in {float(seconds):.2f} s = {mbit:.2f} Mbit/s against "
          f"{LIMIT_MBIT:g}: ratio {ratio:.3f}; policer counters {counted}")
    assert ratio <= 1.3, f"{direction} from the starter's cgroup ran at {mbit:.1f} Mbit/s, limit {LIMIT_MBIT:g}"
    assert ratio >= 0.5, f"{direction} got only {mbit:.1f} Mbit/s of {LIMIT_MBIT:g}: the policer is too tight"
    chain = "sandbox_out" if direction == "upload" else "sandbox_in"
    assert counted.get(chain, 0) >= int(moved)   # the bytes went through this starter's policer
