"""Issue 14, daemon side, pure logic and error paths with fakes: pins, carried counters, pid reuse, release."""
import asyncio
import os
import struct
import subprocess
import sys
import time

import pytest

from lark.daemon import peercred
from lark.daemon.pins import Pin, PinStore, merge_usage
from lark.daemon.server import Larkd
from lark.daemon.slotjob import SlotJobs
from lark.errors import LarkError


def test_merge_usage_adds_counts_and_time_keeps_peaks():
    before = {"bytes_in": 1000, "bytes_out": 10, "packets_in": 3, "packets_out": 1, "seconds": 2.0,
              "peak_in_bps": 900.0, "peak_out_bps": 5.0, "started": 50.0}
    now = {"bytes_in": 3000, "bytes_out": 30, "packets_in": 6, "packets_out": 2, "seconds": 6.0,
           "peak_in_bps": 400.0, "peak_out_bps": 80.0, "polled_at": 99.0}
    m = merge_usage(before, now)
    assert (m["bytes_in"], m["bytes_out"], m["packets_in"], m["packets_out"]) == (4000, 40, 9, 3)
    assert m["seconds"] == 8.0 and m["avg_in_bps"] == pytest.approx(4000 * 8 / 8.0)
    assert (m["peak_in_bps"], m["peak_out_bps"]) == (900.0, 80.0)
    assert m["started"] == 50.0 and m["polled_at"] == 99.0
    assert merge_usage(None, now) is now and merge_usage(before, None) == before


def test_pin_store_roundtrip_and_unreadable_pin_is_an_error(tmp_path):
    store = PinStore(str(tmp_path / "pins"))
    store.save(Pin("slot1", 10, 20, 30, carried={"bytes_in": 5}))
    assert store.load("slot1").carried == {"bytes_in": 5}
    assert [p.key for p in store.all()] == ["slot1"]
    (tmp_path / "pins" / "slot2.json").write_text("{not json")
    with pytest.raises(LarkError, match="unreadable"):
        store.load("slot2")  # never "no pin": that would let the job choose a new namespace
    store.drop("slot1")
    store.drop("slot1")
    assert store.load("slot1") is None


class FakeLoop:
    def __init__(self):
        self.soon, self.removed = [], []

    def call_soon(self, fn, *args):
        self.soon.append((fn, args))

    def remove_reader(self, fd):
        self.removed.append(fd)

    def add_reader(self, fd, *args):
        raise AssertionError("a reused pid must not be watched")


def bare_daemon(tmp_path) -> Larkd:
    d = object.__new__(Larkd)
    d.pins = PinStore(str(tmp_path / "pins"))
    d.jobs = SlotJobs()
    d.loop = FakeLoop()
    return d


def starter(pid=100, start=7, slot="slot1"):
    return peercred.StarterInfo(pid, start, slot, "/x/condor_starter", [])


def test_pin_refuses_another_namespace_for_the_same_starter_even_without_a_record(tmp_path):
    d = bare_daemon(tmp_path)
    d.pin(starter(), "slot1", 1111)
    assert d.pin(starter(), "slot1", 1111).netns_inode == 1111   # the same namespace again: fine
    with pytest.raises(LarkError, match="another network namespace"):
        d.pin(starter(), "slot1", 2222)                           # e.g. after a release, from unshare -n
    # The pin survives a daemon restart (it is on disk) ...
    with pytest.raises(LarkError, match="another network namespace"):
        bare_daemon(tmp_path).pin(starter(), "slot1", 2222)
    # ... and ends with its starter: the slot's next job (another starter) gets its own.
    assert d.pin(starter(pid=101), "slot1", 2222).starter_pid == 101


def test_release_is_refused_to_a_job(tmp_path):
    d = bare_daemon(tmp_path)
    job = peercred.Peer(pid=os.getpid(), uid=65534, gid=65534)
    with pytest.raises(LarkError, match="root only"):
        asyncio.run(d.dispatch({"op": "release", "slot": "slot1"}, job))


def test_pidfd_of_an_exited_process_is_not_alive_whoever_reuses_its_pid():
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    fd = os.pidfd_open(pid)
    try:
        os.waitpid(pid, 0)
        assert not peercred.pidfd_alive(fd)
        peer = peercred.Peer(pid, 0, 0, fd)
        with pytest.raises(LarkError, match="exited while its request was checked"):
            peercred.still_same_process(peer)
    finally:
        os.close(fd)
    me = peercred.Peer(os.getpid(), 0, 0, os.pidfd_open(os.getpid()))
    peercred.still_same_process(me)
    me.close()
    assert me.pidfd is None


def test_watch_does_not_follow_a_reused_pid(tmp_path):
    d = bare_daemon(tmp_path)
    # Our own pid with a start time that is not ours: the starter it names has gone and the pid was reused.
    d.watch("slot1", os.getpid(), peercred.start_time(os.getpid()) + 1)
    assert d.jobs.peek("slot1") is None   # nothing watched
    (fn, args), = d.loop.soon
    assert fn == d._starter_exited and args[0] == "slot1"


def test_namespace_owned_by_another_user_namespace_is_refused(monkeypatch):
    ns, owner = peercred.netns_identity(os.getpid())
    assert owner == peercred.own_userns_inode()   # this test runs in the initial user namespace's netns
    monkeypatch.setattr(peercred, "netns_identity", lambda pid: (ns, owner + 1))
    with pytest.raises(LarkError, match="user namespace the job made"):
        peercred.authorize_job(peercred.Peer(os.getpid(), 65534, 65534), ["/x"], daemon_netns=ns + 1)


def test_admission_per_uid_shared_and_starter_buckets():
    from lark.daemon.admission import Admission
    a = Admission(per_uid=2, per_starter=3, shared=3)
    flood = a.bucket(1000, None)
    assert [a.admit(flood) for _ in range(3)] == [True, True, False]        # per uid
    other = a.bucket(1001, None)
    assert [a.admit(other) for _ in range(2)] == [True, False]              # all non-job uids share 3
    job = a.bucket(1000, 4242)                                             # same uid, but a job's process
    assert job != flood and [a.admit(job) for _ in range(4)] == [True, True, True, False]
    assert all(a.admit("root") for _ in range(50))                          # headroom for root
    a.release(flood)
    assert a.admit(other)                                                   # a freed place is reusable
    for _ in range(10):
        a.release("gone")                                                   # never negative
    assert a.total >= 0


def test_check_rate_limit_reuses_the_answer_within_the_interval():
    from lark.daemon.admission import RateLimit
    r = RateLimit(5.0)
    assert r.recent("s", now=100.0) is None
    r.remember("s", {"plan": 1}, now=100.0)
    assert r.recent("s", now=104.0) == {"plan": 1}
    assert r.recent("s", now=105.5) is None


def test_busy_answer_is_retried_by_the_wrapper(monkeypatch):
    from lark.errors import DaemonBusy
    from lark.job import client
    answers = [DaemonBusy("busy"), DaemonBusy("busy"), {"ok": True, "env": {}}]

    def fake_call(op, **kw):
        a = answers.pop(0)
        if isinstance(a, Exception):
            raise a
        return a
    monkeypatch.setattr(client, "call", fake_call)
    monkeypatch.setattr(client.time, "sleep", lambda s: None)
    assert client.call_patiently("setup", wait=20)["ok"] is True
    assert answers == []


def test_ad_pusher_pushes_figures_and_retries_a_failed_final_push(monkeypatch):
    from lark.daemon import adpush
    calls, fail = [], [True]

    def edit(schedd, job_id, attrs):
        calls.append((schedd, job_id, dict(attrs)))
        if fail[0]:
            raise OSError("schedd down")
    p = adpush.AdPusher(retry_seconds=60, edit=edit)
    schedd = "ap.example"   # the schedd the claim names (policy/startd.py)
    stats = {"usage": {"bytes_in": 123, "bytes_out": 4}, "plan": {"network_type": "nat"}}
    assert p.push("slot1", schedd, "43.0", stats) is False               # logged, not raised
    fail[0] = False
    assert p.push("slot1", schedd, "43.0", stats) is True
    assert calls[-1][0] == "ap.example" and calls[-1][1] == "43.0"
    assert calls[-1][2]["NetworkIncomingBytes"] == "123" and calls[-1][2]["LarkNetworkType"] == '"nat"'
    fail[0] = True
    assert p.push_final("slot1", schedd, "43.0", {"bytes_in": 999}) is False
    assert "slot1" in p.pending
    fail[0] = False
    p.retry_pending()
    assert calls[-1][2]["NetworkIncomingBytes"] == "999" and p.pending == {}
    # A final push the schedd never takes is given up after the retry window.
    fail[0] = True
    p.push_final("slot2", schedd, "44.0", {"bytes_in": 1})
    p.pending["slot2"].until = 0
    p.retry_pending()
    assert p.pending == {}
    assert p.push("slot3", "", "45.0", stats) is False               # no schedd known: nothing to push
    assert p.push_final("slot3", "", "45.0", {"bytes_in": 1}) is False and "slot3" not in p.pending


def test_final_push_of_a_short_fair_share_job_carries_the_limit_it_ran_under():
    """A job that ends before the first push: its record (and plan) is gone, the summary still names its limit."""
    from lark.daemon.adpush import AdPusher
    calls = []
    p = AdPusher(edit=lambda schedd, job, attrs: calls.append(attrs))
    summary = {"bytes_in": 5, "network_type": "bridge", "ipv4": "10.1.0.7", "rate_limit_mbit": 133.333,
               "owner": "alice"}
    assert p.push_final("slot1", "ap", "7.0", summary) is True
    assert calls[-1]["LarkBandwidthLimit"] == "133.333" and calls[-1]["LarkNetworkType"] == '"bridge"'
    assert calls[-1]["LarkIPv4Address"] == '"10.1.0.7"' and "Owner" not in calls[-1]
    p.push_final("slot2", "ap", "8.0", {"bytes_in": 1})   # no limit (unlimited job): none pushed
    assert "LarkBandwidthLimit" not in calls[-1]


def test_callout_input_cannot_be_forged_by_a_newline_in_a_job_attribute(tmp_path):
    """A job attribute holding "\\n------\\nVLAN = 7" must not become a separator and a machine attribute."""
    import classad2
    from lark.policy.callout import run_callout
    script = tmp_path / "callout"
    script.write_text("#!/usr/bin/env python3\nimport sys\n"
                      "parts = sys.stdin.read().split('\\n------\\n')\n"
                      "machine = [l for l in parts[-1].splitlines() if l.strip()]\n"
                      "print(f'Parts = {len(parts)}')\n"
                      "print('MachineVLAN = ' + next((l.split('=', 1)[1] for l in machine if l.startswith('VLAN')), "
                      "'undefined'))\n")
    script.chmod(0o755)
    job = classad2.ClassAd()
    job["ClusterId"] = 1
    job["Cmd"] = "x\n------\nVLAN = 7\n"
    machine = classad2.ClassAd()
    machine["Bandwidth"] = 100
    out = run_callout(str(script), job, machine, timeout=10)
    assert out["Parts"] == 2
    assert "MachineVLAN" not in out or out.get("MachineVLAN") is classad2.Value.Undefined


def test_deep_json_is_a_clear_error_not_a_recursion_traceback():
    from lark import protocol
    with pytest.raises(LarkError, match="nests too deeply"):
        protocol.parse_request(b"[" * 200_000 + b"]" * 200_000 + b"\n")


def test_log_limit_per_party_with_a_count_of_what_was_dropped():
    from lark.daemon.admission import LogLimit
    lim = LogLimit(per_minute=3)
    got = [lim.allow(65534, now=10.0 + i * 0.01) for i in range(10)]
    assert [ok for ok, _ in got] == [True] * 3 + [False] * 7
    assert lim.allow(0, now=11.0) == (True, 0)            # another party is not affected
    assert lim.allow(65534, now=71.0) == (True, 7)        # next minute: the drop count is reported once


def test_state_files_refuse_links_and_foreign_owners(tmp_path):
    from lark.daemon.records import FinishedStore, RecordStore, read_own
    store = RecordStore(str(tmp_path / "jobs"))
    assert oct(os.stat(store.dir).st_mode & 0o777) == "0o700"
    secret = tmp_path / "secret"
    secret.write_text('{"key": "x"}')
    os.symlink(secret, store.path("slot1"))
    assert store.load("slot1") is None                  # a planted link is not followed
    with pytest.raises(OSError):
        read_own(store.path("slot1"))
    # A link planted at the temp name is not written through either.
    import threading
    target = tmp_path / "target"
    target.write_text("untouched")
    os.symlink(target, f"{store.path('slot2')}.tmp.{os.getpid()}.{threading.get_ident()}")
    from lark.daemon.records import JobRecord
    store.save(JobRecord("slot2", "slot2", "1.0", 1, 2, 3, 4, "ns", "if", {}))
    assert target.read_text() == "untouched" and store.load("slot2").job_id == "1.0"
    fin = FinishedStore(str(tmp_path / "finished"))
    assert oct(os.stat(fin.dir).st_mode & 0o777) == "0o700"   # who moved what is for root only
    name = fin.save("slot1", {"ended": 1.0, "bytes_in": 5})
    assert oct(os.stat(os.path.join(fin.dir, name)).st_mode & 0o777) == "0o600"
    if os.geteuid() == 0:
        os.chown(os.path.join(fin.dir, name), 65534, 65534)
        assert fin.latest_for_key("slot1") is None          # a file someone else owns is not trusted
    os.chmod(tmp_path / "finished", 0o777)
    FinishedStore(str(tmp_path / "finished"))
    assert oct(os.stat(tmp_path / "finished").st_mode & 0o777) == "0o700"   # a loosened mode is put back


def test_doctor_does_not_import_lark_from_the_current_directory(tmp_path, monkeypatch):
    import subprocess as sp
    from lark import doctor
    planted = tmp_path / "lark"
    planted.mkdir()
    marker = tmp_path / "ran"
    (planted / "__init__.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
    (planted / "doctor.py").write_text("print('{}')\n")
    seen, real_run = {}, sp.run

    def fake_run(argv, **kw):
        seen["argv"], seen["cwd"] = argv, kw.get("cwd")
        # Run the probe's interpreter the same way, minus `unshare` (needs root) and the probe itself.
        probe = [a for a in argv if a != "unshare" and a != "--net"]
        probe = probe[:probe.index("-m")] + ["-c", "import lark; print('{}')"]
        return real_run(probe, cwd=kw.get("cwd"), capture_output=True, text=True)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(doctor.subprocess, "run", fake_run)
    doctor.run()
    assert not marker.exists(), seen
    assert "-P" in seen["argv"] and seen["cwd"] == "/"


def test_client_turns_a_busy_answer_into_a_retryable_error(tmp_path):
    import socket
    import threading
    from lark import protocol
    from lark.errors import DaemonBusy
    from lark.job.client import call
    path = str(tmp_path / "s")
    srv = socket.socket(socket.AF_UNIX)
    srv.bind(path)
    srv.listen(1)

    def answer_busy():
        c, _ = srv.accept()
        c.sendall(protocol.error("larkd is busy: too many open connections from uid:1; retry", busy=True))
        c.close()
    t = threading.Thread(target=answer_busy)
    t.start()
    with pytest.raises(DaemonBusy, match="busy"):
        call("setup", path=path, timeout=5)
    t.join()
    srv.close()


def test_final_push_is_skipped_when_the_barrier_already_pushed_the_same_counters():
    """After the JOB_EXIT barrier's push the job usually leaves the queue before teardown: a final push with the
    same counters would fail and be retried for nothing. One with new counters still goes out."""
    from lark.daemon.adpush import AdPusher
    calls = []
    p = AdPusher(edit=lambda schedd, job, attrs: calls.append(dict(attrs)))
    usage = {"bytes_in": 500, "bytes_out": 7, "packets_in": 3, "packets_out": 2, "avg_in_bps": 10.0}
    assert p.push("slot1", "ap", "9.0", {"usage": usage, "plan": {"network_type": "nat"}})
    assert p.push_final("slot1", "ap", "9.0", dict(usage, avg_in_bps=9.5)) is True
    assert len(calls) == 1 and p.pending == {}
    # Another job of the slot, or more bytes since the barrier: pushed.
    assert p.push("slot1", "ap", "9.0", {"usage": usage, "plan": {}})
    assert p.push_final("slot1", "ap", "9.0", dict(usage, bytes_in=600)) is True
    assert calls[-1]["NetworkIncomingBytes"] == "600"
    assert p.push("slot1", "ap", "9.0", {"usage": usage, "plan": {}})
    assert p.push_final("slot1", "ap", "10.0", usage) is True and calls[-1]["NetworkIncomingBytes"] == "500"
    assert len(calls) == 5


def test_obsolete_job_exit_hook_asks_nothing_writes_nothing_and_says_to_remove_it(monkeypatch, caplog):
    """lark-hook stays only so that an old configuration naming it does not stall the starter: it carries no
    figure, talks to no one, and tells the admin to remove the knob (a JOB_EXIT hook breaks file transfer)."""
    from lark.job import update_hook
    monkeypatch.setattr(update_hook.sys, "stdin", __import__("io").StringIO("Owner = \"alice\"\n"))
    with caplog.at_level("WARNING", logger="lark-hook"):
        assert update_hook.main(["exit"]) == 0
    assert "remove LARK_HOOK_JOB_EXIT" in caplog.text
    assert not {"call", "chirp_path", "subprocess", "socket"} & set(vars(update_hook))


def test_holding_a_job_names_its_schedd_and_a_refusal_is_false_not_fatal(caplog):
    from lark.daemon.adpush import AdPusher
    asked = []
    p = AdPusher(hold=lambda schedd, job, reason: asked.append((schedd, job, reason)))
    assert p.hold("ap1.example", "3.0", "Lark: no network") is True
    assert asked == [("ap1.example", "3.0", "Lark: no network")]
    assert p.hold("", "3.0", "Lark: no network") is False and len(asked) == 1   # no claim's schedd: no hold

    def refuse(schedd, job, reason):
        raise LookupError("the schedd did not hold job 3.0")
    with caplog.at_level("WARNING"):
        assert AdPusher(hold=refuse).hold("ap1", "3.0", "x") is False
    assert "could not hold job 3.0 at schedd ap1" in caplog.text


# -- issue 23 item 14: process identity on kernels without SO_PEERPIDFD, pid reuse simulated by start times ---
class NoPeerPidfdSocket:
    """A connected socket on a kernel older than 6.5: SO_PEERCRED works, SO_PEERPIDFD is unknown."""

    def __init__(self, pid: int):
        self.pid = pid

    def getsockopt(self, level, opt, size):
        if opt == peercred.SO_PEERPIDFD:
            raise OSError(92, "Protocol not available")   # ENOPROTOOPT
        return struct.pack("3i", self.pid, 65534, 65534)


def test_without_so_peerpidfd_a_reused_pid_is_told_apart_by_its_start_time(monkeypatch):
    child = subprocess.Popen(["sleep", "30"])
    try:
        peer = peercred.peer_of(NoPeerPidfdSocket(child.pid))
        assert peer.pidfd is None and peer.start == peercred.start_time(child.pid)
        peercred.still_same_process(peer)                 # the same process: accepted
        real = peercred.start_time
        # Another process now holds the pid: same number, later start time.
        monkeypatch.setattr(peercred, "start_time", lambda pid: real(pid) + 1 if pid == child.pid else real(pid))
        with pytest.raises(LarkError, match="exited while its request was checked"):
            peercred.still_same_process(peer)
        monkeypatch.undo()
    finally:
        child.kill()
        child.wait()
    with pytest.raises(LarkError, match="exited while its request was checked"):
        peercred.still_same_process(peer)                 # exited and reaped: no process has its start time


def test_a_peer_gone_before_it_was_read_is_refused():
    child = subprocess.Popen(["true"])
    child.wait()
    peer = peercred.peer_of(NoPeerPidfdSocket(child.pid))
    with pytest.raises(LarkError, match="exited while its request was checked"):
        peercred.still_same_process(peer)


def _dispatching_daemon(tmp_path, monkeypatch):
    from helpers.fakekernel import fake_networker

    from lark.daemon import server as server_mod
    from lark.plan import NetworkPlan
    net, _ = fake_networker(str(tmp_path), monkeypatch, ad_source="files", ad_dir=str(tmp_path / "ads"))
    d = server_mod.Larkd(net.cfg)
    d.fw, d.net, d.records, d.acct, d.finished = net.fw, net, net.records, net.acct, net.finished
    me = starter(pid=os.getpid(), start=peercred.start_time(os.getpid()))
    monkeypatch.setattr(server_mod.peercred, "find_starter", lambda pid, paths: me)
    monkeypatch.setattr(d, "plan_for", lambda st, key: NetworkPlan(job_id="3.0", slot=st.slot, key=key))
    return d


@pytest.mark.parametrize("op,uid", [("check", 1000), ("stats", 1000), ("push", 1000), ("release", 0),
                                    ("stats", 0)])
def test_every_request_acting_on_a_job_checks_the_peer_is_still_the_process_that_connected(
        tmp_path, monkeypatch, op, uid):
    d = _dispatching_daemon(tmp_path, monkeypatch)
    me = os.getpid()
    # This process stands for the one that reused the pid of the peer that connected (another start time).
    replaced = peercred.Peer(pid=me, uid=uid, gid=uid, start=peercred.start_time(me) - 1)
    same = peercred.Peer(pid=me, uid=uid, gid=uid, start=peercred.start_time(me))

    async def ask(who):
        d.loop = asyncio.get_running_loop()
        return await d.dispatch({"op": op, "slot": "slot1"}, who)
    with pytest.raises(LarkError, match="exited while its request was checked"):
        asyncio.run(ask(replaced))
    assert b'"ok": true' in asyncio.run(ask(same)).replace(b'"ok":true', b'"ok": true')


def test_setup_checks_the_peer_by_start_time_without_a_pidfd(monkeypatch):
    ns, owner = peercred.netns_identity(os.getpid())
    monkeypatch.setattr(peercred, "find_starter", lambda pid, paths: starter())
    me = os.getpid()
    replaced = peercred.Peer(me, 65534, 65534, start=peercred.start_time(me) - 1)
    with pytest.raises(LarkError, match="exited while its request was checked"):
        peercred.authorize_job(replaced, ["/x"], daemon_netns=ns + 1, daemon_userns=owner)
    same = peercred.Peer(me, 65534, 65534, start=peercred.start_time(me))
    assert peercred.authorize_job(same, ["/x"], daemon_netns=ns + 1, daemon_userns=owner) == (starter(), ns)


@pytest.fixture
def starter_tree(tmp_path):
    """A real tree: a root-owned "starter" and its child "job"."""
    if os.geteuid() != 0:
        pytest.skip("the starter must be root-owned")
    from helpers.proctree import starter_with_job
    with starter_with_job(tmp_path) as tree:
        yield tree


def test_starter_found_up_the_tree_is_pinned_against_pid_reuse(starter_tree, monkeypatch):
    starter_pid, job_pid, path = starter_tree
    got = peercred.find_starter(job_pid, [path])
    assert got is not None and got.pid == starter_pid and got.start == peercred.start_time(starter_pid)
    real = peercred.start_time
    real_ps = peercred.parent_and_start
    # The starter's pid now names a process younger than the job: the starter died and its pid was reused. The
    # walk reads each process's parent and start time together (parent_and_start).
    monkeypatch.setattr(peercred, "parent_and_start",
                        lambda pid: (real_ps(pid)[0], real(job_pid) + 1) if pid == starter_pid else real_ps(pid))
    with pytest.raises(LarkError, match="pid reuse"):
        peercred.find_starter(job_pid, [path])
    monkeypatch.setattr(peercred, "parent_and_start", real_ps)
    # The pid is reused while its exe, uid and command line are read: the second reading (alive) differs.
    monkeypatch.setattr(peercred, "start_time", lambda pid: real(pid) + 7 if pid == starter_pid else real(pid))
    with pytest.raises(LarkError, match="starter exited while it was read"):
        peercred.find_starter(job_pid, [path])


def test_proc_files_are_read_whole_past_one_read():
    """peercred reads /proc with os.read in 4 KiB steps: a command line longer than that comes back whole."""
    long_arg = "x" * 10_000
    argv = [sys.executable, "-c", "import time; time.sleep(30)", long_arg]  # the argument ignored, not refused
    child = subprocess.Popen(argv)
    try:
        for _ in range(500):  # until its exec is visible (the command line is empty before)
            if peercred.cmdline(child.pid):
                break
            time.sleep(0.01)
        assert peercred.cmdline(child.pid) == argv
        assert peercred.parent_and_start(child.pid) == (os.getpid(), peercred.start_time(child.pid))
        assert peercred.real_uid(child.pid) == os.getuid()
    finally:
        child.kill()
        child.wait()


def test_resolved_path_names_the_file_as_realpath_does(tmp_path):
    """The starter paths are resolved by the kernel (O_PATH, /proc/self/fd): through links to files and to
    directories, the same path os.path.realpath gives; a missing path falls back to realpath itself."""
    real_dir = tmp_path / "real"
    real_dir.mkdir()
    target = real_dir / "condor_starter"
    target.write_text("")
    (tmp_path / "dir_link").symlink_to(real_dir)
    (tmp_path / "file_link").symlink_to(tmp_path / "dir_link" / "condor_starter")
    for path in (target, tmp_path / "dir_link" / "condor_starter", tmp_path / "file_link",
                 tmp_path / "missing" / "condor_starter", real_dir / ".." / "real" / "condor_starter"):
        assert peercred.resolved_path(str(path)) == os.path.realpath(path)
