"""larkd's dispatch and background releases, with the kernel replaced by an in-memory fake."""
import asyncio
import json
import logging
import os

import pytest

from helpers.fakekernel import fake_networker
from lark.daemon import server as server_mod
from lark.daemon.peercred import Peer, StarterInfo, start_time
from lark.daemon.slotjob import Pushed
from lark.errors import LarkError
from lark.plan import NetworkPlan
from lark.policy.startd import JobIdentity

ME = os.getpid()


def _daemon(tmp_path, monkeypatch):
    net, k = fake_networker(str(tmp_path), monkeypatch, ad_source="files", ad_dir=str(tmp_path / "ads"))
    d = server_mod.Larkd(net.cfg)
    d.fw, d.net, d.records, d.acct, d.finished = net.fw, net, net.records, net.acct, net.finished
    starter = StarterInfo(pid=ME, start=start_time(ME), slot="slot1", exe="/usr/sbin/condor_starter", argv=[])
    monkeypatch.setattr(server_mod.peercred, "authorize_job", lambda who, paths, *inodes: (starter, 4242))
    monkeypatch.setattr(server_mod.peercred, "find_starter", lambda pid, paths: starter if pid == ME else None)
    monkeypatch.setattr(d, "plan_for", lambda st, key: NetworkPlan(job_id="3.0", slot=st.slot, key=key))
    return d, k


def _run(d, coro_fn):
    async def main():
        d.loop = asyncio.get_running_loop()
        return await coro_fn()
    return asyncio.run(main())


def _answer(raw: bytes) -> dict:
    return json.loads(raw)


def test_setup_then_release_through_dispatch(tmp_path, monkeypatch):
    d, k = _daemon(tmp_path, monkeypatch)
    job = Peer(pid=ME, uid=1000, gid=1000)

    async def flow():
        a = _answer(await d.dispatch({"op": "setup"}, job))
        again = _answer(await d.dispatch({"op": "setup"}, job))
        for slot_job in d.jobs:  # the fake starter is this test process: do not wait for it to exit
            slot_job.stop_watch(d.loop)
        r = _answer(await d.dispatch({"op": "release", "slot": "slot1"}, Peer(pid=ME, uid=0, gid=0)))
        return a, again, r

    a, again, r = _run(d, flow)
    assert a["ok"] and a["plan"]["ipv4"] == "10.77.0.2" and a["env"]["LARK_IPV4_ADDRESS"] == "10.77.0.2"
    assert again["reused"] is True and again["plan"] == a["plan"]
    # Its starter still runs: the figures are carried for the job's one final record, not written as finished.
    assert r["ok"] and r["summary"] is not None and d.pins.load("slot1").carried == r["summary"]
    assert d.finished.latest_for_key("slot1") is None
    assert k.objects == set() and d.active == set()


def test_root_only_operations_are_refused_to_jobs(tmp_path, monkeypatch):
    d, _ = _daemon(tmp_path, monkeypatch)
    stranger = Peer(pid=1, uid=1000, gid=1000)
    with pytest.raises(LarkError, match="operation status is for root only"):
        _run(d, lambda: d.dispatch({"op": "status"}, Peer(pid=ME, uid=1000, gid=1000)))
    with pytest.raises(LarkError, match="release is for root only"):
        _run(d, lambda: d.dispatch({"op": "release", "slot": "slot1"}, stranger))


def test_failed_setup_leaves_the_slot_inactive(tmp_path, monkeypatch):
    d, k = _daemon(tmp_path, monkeypatch)
    k.fail.add("links.create_veth")
    with pytest.raises(LarkError, match="injected failure of links.create_veth"):
        _run(d, lambda: d.dispatch({"op": "setup"}, Peer(pid=ME, uid=1000, gid=1000)))
    assert d.active == set() and k.objects == set() and d.records.keys() == []


def test_a_failing_background_release_is_kept_referenced_and_logged(tmp_path, monkeypatch, caplog):
    d, k = _daemon(tmp_path, monkeypatch)

    async def flow():
        await d.dispatch({"op": "setup"}, Peer(pid=ME, uid=1000, gid=1000))
        k.fail.add("nftables.remove_job")
        fd = d.jobs.get("slot1").watch
        d._starter_exited("slot1", fd)  # what the pidfd reader calls when the starter exits
        assert len(d.tasks) == 1  # referenced while it runs (the loop keeps only weak references)
        await asyncio.gather(*d.tasks, return_exceptions=True)
        await asyncio.sleep(0)
        return set(d.tasks)

    with caplog.at_level(logging.ERROR, logger="larkd"):
        left = _run(d, flow)
    assert left == set() and d.active == set() and d.jobs.get("slot1").watch is None
    assert any("release of slot1 failed" in r.getMessage() and "could not remove the nftables rules" in r.getMessage()
               for r in caplog.records)
    assert k.of_key("slot1") == {("fw:nftables", "slot1")}  # everything but the failing firewall is gone


def test_running_jobs_are_pushed_at_first_poll_again_soon_then_every_interval_and_failures_retried(tmp_path,
                                                                                                   monkeypatch):
    from lark.daemon.pins import Pin
    d, _ = _daemon(tmp_path, monkeypatch)
    d.cfg.schedd_push_interval = 60.0
    clock = [1000.0]
    monkeypatch.setattr(server_mod.time, "monotonic", lambda: clock[0])
    answers, pushed = [True], []

    class FakePusher:
        def push(self, key, gid, job_id, stats):
            pushed.append((clock[0], job_id))
            return answers.pop(0) if answers else True

        def retry_pending(self):
            pass

    d.pusher = FakePusher()
    monkeypatch.setattr(d, "stats", lambda key: {"key": key})
    d.pins.save(Pin(key="slot1", starter_pid=ME, starter_start=1, netns_inode=7, job_id="3.0",
                    global_job_id="ap#3.0#1", schedd="ap"))
    d.active = {"slot1"}

    def poll_at(t):
        clock[0] = t
        d.push_running()

    for t in (1000.0, 1001.0, 1005.0, 1006.0, 1030.0, 1065.0):
        poll_at(t)
    assert [t for t, _ in pushed] == [1000.0, 1005.0, 1065.0]   # first poll, 5 s later, then every 60 s
    answers.append(False)                                        # the schedd refuses once: tried at the next poll
    poll_at(1125.0)
    poll_at(1126.0)
    assert [t for t, _ in pushed][-2:] == [1125.0, 1126.0]
    # The slot's next job (seen before any poll noticed the first one end) is pushed at once.
    d.pins.save(Pin(key="slot1", starter_pid=ME, starter_start=2, netns_inode=8, job_id="4.0",
                    global_job_id="ap#4.0#1", schedd="ap"))
    poll_at(1127.0)
    assert pushed[-1] == (1127.0, "4.0")


def test_job_exit_barrier_pushes_fresh_figures_once_and_refuses_strangers(tmp_path, monkeypatch):
    """`push` (the wrapper's exit barrier): larkd reads the counters and writes the job's ad itself; a process
    outside any job cannot ask. A job's own requests get one push per 30 s (the rest are refused before any counter
    poll); its first barrier goes regardless of them, a second one is an ordinary request."""
    from lark.daemon.pins import Pin
    d, _ = _daemon(tmp_path, monkeypatch)
    clock = [1000.0]
    monkeypatch.setattr(server_mod.time, "monotonic", lambda: clock[0])
    polls, pushed = [], []

    class FakePusher:
        def push(self, key, gid, job_id, stats):
            pushed.append((gid, job_id, stats["usage"]))
            return True

    d.pusher = FakePusher()
    monkeypatch.setattr(d.acct, "poll", lambda: polls.append(clock[0]))
    monkeypatch.setattr(d, "stats", lambda key: {"key": key, "usage": {"bytes_in": len(polls)}})
    d.pins.save(Pin(key="slot1", starter_pid=ME, starter_start=1, netns_inode=7, job_id="3.0",
                    global_job_id="ap#3.0#1", schedd="ap"))
    d.active = {"slot1"}
    hook = Peer(pid=ME, uid=1000, gid=1000)

    async def flow():
        # a periodic push just before: the barrier still goes
        d.jobs.get("slot1").pushed = Pushed("3.0", clock[0] - 0.5, 2)
        answers = [_answer(await d.dispatch({"op": "push"}, hook))]
        clock[0] += 1.0
        answers.append(_answer(await d.dispatch({"op": "push"}, hook)))
        clock[0] += 30.0
        answers.append(_answer(await d.dispatch({"op": "push"}, hook)))
        clock[0] += 0.5
        answers.append(_answer(await d.dispatch({"op": "push", "barrier": True}, hook)))
        clock[0] += 0.5
        answers.append(_answer(await d.dispatch({"op": "push", "barrier": True}, hook)))
        return answers

    first, again, later, barrier, second_barrier = _run(d, flow)
    assert first["ok"] and first["pushed"] is True and later["pushed"] is True and barrier["pushed"] is True
    for refused in (again, second_barrier):
        assert refused["pushed"] is False and refused["refused"] is True and refused["retry_after"] > 0
        assert "job 3.0" in refused["reason"] and "once every 30 s" in refused["reason"]
    # Counters read fresh for each push that went out, and those are what was pushed; refusals read nothing.
    assert d.jobs.get("slot1").pushed == Pushed("3.0", 1031.5, 5)
    assert polls == [1000.0, 1031.0, 1031.5] and pushed == [("ap", "3.0", {"bytes_in": 1}),
                                                           ("ap", "3.0", {"bytes_in": 2}),
                                                           ("ap", "3.0", {"bytes_in": 3})]
    with pytest.raises(LarkError, match="only a job's own processes may ask larkd to push"):
        _run(d, lambda: d.dispatch({"op": "push"}, Peer(pid=1, uid=1000, gid=1000)))


def test_a_slow_schedd_does_not_hold_up_the_next_jobs_setup(tmp_path, monkeypatch):
    """A job's end-of-job push waits on its schedd; the next job's setup on the EP must not wait behind it (the
    pushes have their own threads, not the setup workers)."""
    import concurrent.futures
    import threading
    from lark.daemon.pins import Pin
    d, _ = _daemon(tmp_path, monkeypatch)
    d.pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="lark-setup")   # one setup worker
    schedd_answers = threading.Event()

    class SlowSchedd:
        def push(self, key, gid, job_id, stats):
            schedd_answers.wait(10)
            return True

    d.pusher = SlowSchedd()
    monkeypatch.setattr(d, "stats", lambda key: {"key": key, "usage": {}})
    d.pins.save(Pin(key="slot9", starter_pid=ME, starter_start=1, netns_inode=7, job_id="2.0",
                    global_job_id="ap#2.0#1", schedd="ap"))

    async def flow():
        ending = StarterInfo(pid=ME, start=start_time(ME), slot="slot9", exe="/usr/sbin/condor_starter", argv=[])
        monkeypatch.setattr(server_mod.peercred, "find_starter", lambda pid, paths: ending)
        push = asyncio.ensure_future(d.dispatch({"op": "push"}, Peer(pid=ME, uid=1000, gid=1000)))
        await asyncio.sleep(0.1)              # the push now waits on the schedd
        setup = await asyncio.wait_for(d.dispatch({"op": "setup"}, Peer(pid=ME, uid=1000, gid=1000)), 5)
        pushed_yet = push.done()
        schedd_answers.set()
        await push
        for slot_job in d.jobs:
            slot_job.stop_watch(d.loop)
        return _answer(setup), pushed_yet

    answer, pushed_yet = _run(d, flow)
    assert answer["ok"] and not pushed_yet


@pytest.mark.parametrize("schedd_holds", [True, False])
def test_a_setup_that_fails_after_the_check_holds_the_job_at_its_schedd(tmp_path, monkeypatch, schedd_holds):
    """Issue 23 item 3: the wrapper can only exit, which HTCondor records as a completed job; larkd holds the job
    at its schedd with the reason and says so in its answer (the wrapper then waits to be vacated)."""
    d, _ = _daemon(tmp_path, monkeypatch)
    holds = []

    class FakePusher:
        def hold(self, gid, job_id, reason):
            holds.append((gid, job_id, reason))
            return schedd_holds

    d.pusher = FakePusher()
    d.identities[(ME, start_time(ME))] = JobIdentity(schedd="ap", job_id="3.0", user="alice@example.net",
                                                     global_job_id="ap#3.0#1")

    def broken_setup(*a, **kw):
        raise LarkError("no IPv6 pool on this execution point", job="3.0", fix="set subnet6")
    monkeypatch.setattr(d.net, "setup", broken_setup)
    with pytest.raises(LarkError, match="no IPv6 pool") as raised:
        _run(d, lambda: d.dispatch({"op": "setup"}, Peer(pid=ME, uid=1000, gid=1000)))
    assert raised.value.held is schedd_holds
    assert len(holds) == 1 and holds[0][:2] == ("ap", "3.0")
    assert holds[0][2].startswith("Lark: job not started, its network could not be set up: job 3.0:")
    assert "no IPv6 pool" in holds[0][2] and "\n" not in holds[0][2]
    assert d.active == set()


def test_the_check_refuses_every_job_where_no_network_namespace_can_be_made(tmp_path, monkeypatch):
    d, _ = _daemon(tmp_path, monkeypatch)
    limit = tmp_path / "max_net_namespaces"
    limit.write_text("0\n")
    monkeypatch.setattr(server_mod.netns, "MAX_NET_NAMESPACES", str(limit))
    with pytest.raises(LarkError, match=r"user.max_net_namespaces = 0: this execution point allows no network"):
        _run(d, lambda: d.dispatch({"op": "check"}, Peer(pid=ME, uid=1000, gid=1000)))
    limit.write_text("100\n")
    assert _answer(_run(d, lambda: d.dispatch({"op": "check"}, Peer(pid=ME, uid=1000, gid=1000))))["ok"]


def test_a_jobs_own_uploads_do_not_buy_it_more_schedd_pushes(tmp_path, monkeypatch):
    """A job can run the transfer plugin itself with -upload as often as it likes: the push larkd makes after an
    upload comes out of the same budget as the job's own `push` requests (one per 30 s)."""
    from lark.daemon.pins import Pin
    d, _ = _daemon(tmp_path, monkeypatch)
    clock = [1000.0]
    monkeypatch.setattr(server_mod.time, "monotonic", lambda: clock[0])
    pushed = []

    class FakePusher:
        def push(self, key, schedd, job_id, stats):
            pushed.append(clock[0])
            return True

    d.pusher = FakePusher()
    monkeypatch.setattr(d.acct, "poll", lambda: None)
    monkeypatch.setattr(d, "stats", lambda key: {"key": key, "usage": {}})
    d.pins.save(Pin(key="slot1", starter_pid=ME, starter_start=1, netns_inode=7, job_id="3.0",
                    global_job_id="ap#3.0#1", schedd="ap"))
    d.active = {"slot1"}

    async def flow():
        for _ in range(5):
            await d._push_now("slot1")
            clock[0] += 1.0
        clock[0] += 30.0
        await d._push_now("slot1")
        return _answer(await d.dispatch({"op": "push"}, Peer(pid=ME, uid=1000, gid=1000)))

    after = _run(d, flow)
    assert pushed == [1000.0, 1035.0]
    assert after["pushed"] is False and after["refused"] is True   # the upload's push spent the budget


def test_a_transfer_plugin_of_a_job_with_no_network_is_refused_with_result_ads_and_builds_nothing(tmp_path,
                                                                                                 monkeypatch):
    import classad2
    d, k = _daemon(tmp_path, monkeypatch)
    plugins = tmp_path / "libexec"
    plugins.mkdir(mode=0o755)
    os.chmod(plugins, 0o755)
    (plugins / "curl_plugin").write_text("#!/bin/sh\n")
    os.chmod(plugins / "curl_plugin", 0o755)
    d.cfg.transfer_plugin_dir = str(plugins)
    monkeypatch.setattr(d, "plan_for", lambda st, key: NetworkPlan(job_id="3.0", slot=st.slot, key=key,
                                                                    network_type="none"))
    request = '[ Url = "http://w/a.bin"; LocalFileName = "/x/a.bin" ]'
    argv = ["curl_plugin", "-infile", "/x/.curl_plugin.in", "-outfile", "/x/.curl_plugin.in.out"]
    answer = _answer(_run(d, lambda: d.dispatch({"op": "transfer_plugin", "argv": argv, "request": request},
                                                Peer(pid=ME, uid=1000, gid=1000), object(), object())))
    assert answer["ok"] is False and "gives it no network" in answer["error"]
    [ad] = classad2.parseAds(answer["results"])
    assert ad["TransferSuccess"] is False and ad["TransferUrl"] == "http://w/a.bin"
    assert "Lark: this transfer gets no network" in ad["TransferError"]
    assert k.objects == set() and d.records.keys() == [] and d.active == set()
    # A job writes the request itself: thousands of ads in one request line get a bounded answer.
    from lark.daemon.transfer_plugin import MAX_RESULT_ADS, failure_ads
    many = '[ Url = "http://w/x" ]' * 3000
    assert len(list(classad2.parseAds(failure_ads(many, "Lark: no")))) == MAX_RESULT_ADS
