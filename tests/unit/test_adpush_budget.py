"""Issue 23 item 10 (push amplification) and issue 28's HTCondor attributes, against a fake schedd that counts
edits: a job looping on `push` costs at most its budget, a neighbour's exit barrier is served before queued
routine pushes, a push is one edit carrying only what changed, and NetworkInputMb/NetworkOutputMb are the bytes."""
import asyncio
import json
import os
import sys
import threading
import types

import pytest
from helpers.fakekernel import fake_networker

from lark.daemon import adpush
from lark.daemon import server as server_mod
from lark.daemon.adpush import ROUTINE, URGENT, AdPusher, PushQueue, job_attributes
from lark.daemon.peercred import Peer, StarterInfo
from lark.daemon.pins import Pin

ME = os.getpid()


class FakeSchedd:
    """Counts edits per job, in the order the schedd received them."""

    def __init__(self):
        self.edits: list[tuple[str, dict[str, str]]] = []

    def edit(self, schedd: str, job_id: str, attrs: dict[str, str]) -> None:
        self.edits.append((job_id, dict(attrs)))


def _daemon(tmp_path, monkeypatch, schedd):
    net, _ = fake_networker(str(tmp_path), monkeypatch, ad_source="files", ad_dir=str(tmp_path / "ads"))
    d = server_mod.Larkd(net.cfg)
    d.fw, d.net, d.records, d.acct, d.finished = net.fw, net, net.records, net.acct, net.finished
    d.pusher = AdPusher(edit=schedd.edit, between=d.push_pool.run_urgent)
    # Two jobs on two slots; the asking process's uid says which job it belongs to.
    starters = {1001: StarterInfo(pid=ME, start=1, slot="slot1", exe="/usr/sbin/condor_starter", argv=[]),
                1002: StarterInfo(pid=ME, start=2, slot="slot2", exe="/usr/sbin/condor_starter", argv=[])}
    monkeypatch.setattr(server_mod.peercred, "starter_of", lambda who, paths: starters.get(who.uid), raising=False)
    d.pins.save(Pin(key="slot1", starter_pid=ME, starter_start=1, netns_inode=7, job_id="4.0",
                    global_job_id="ap#4.0#1", schedd="ap"))
    d.pins.save(Pin(key="slot2", starter_pid=ME, starter_start=2, netns_inode=8, job_id="5.0",
                    global_job_id="ap#5.0#1", schedd="ap"))
    d.active = {"slot1", "slot2"}
    return d


def test_a_job_looping_on_push_costs_its_budget_only_and_a_neighbours_barrier_goes_first(tmp_path, monkeypatch):
    schedd = FakeSchedd()
    d = _daemon(tmp_path, monkeypatch, schedd)
    clock = [1000.0]
    monkeypatch.setattr(server_mod.time, "monotonic", lambda: clock[0])
    polls = []
    monkeypatch.setattr(d.acct, "poll", lambda: polls.append(clock[0]))
    # Counters move with every reading, so every push that goes out has something new to write.
    readings = []

    def stats(key):
        readings.append(key)
        return {"key": key, "plan": {"network_type": "nat"}, "usage": {"bytes_in": 1000 * len(readings)}}
    monkeypatch.setattr(d, "stats", stats)
    looper, neighbour = Peer(pid=ME, uid=1001, gid=1001), Peer(pid=ME, uid=1002, gid=1002)
    schedd_busy = threading.Event()

    async def queued(coro):
        """Start a request and return once it is answered or waits in the push queue (no clock involved)."""
        task = asyncio.ensure_future(coro)
        before = d.push_pool._work.qsize()
        while not task.done() and d.push_pool._work.qsize() == before:
            await asyncio.sleep(0)   # the loop's clock is the frozen one: yield, do not time
        return task

    async def flow():
        d.loop = asyncio.get_running_loop()
        # The schedd is slow: the push thread is busy with an edit while the requests arrive.
        held = d.loop.run_in_executor(d.push_pool, schedd_busy.wait, 30)
        tasks = []
        for _ in range(61):   # one request a second for a minute
            tasks.append(await queued(d.dispatch({"op": "push"}, looper)))
            clock[0] += 1.0
        barrier = await queued(d.dispatch({"op": "push", "barrier": True}, neighbour))
        schedd_busy.set()
        await held
        return [json.loads(await t) for t in tasks], json.loads(await barrier)

    try:
        answers, barrier = asyncio.run(flow())
    finally:
        schedd_busy.set()
    served = [a for a in answers if a["pushed"]]
    refused = [a for a in answers if not a["pushed"]]
    assert len(served) == 3 and len(refused) == 58        # at 0 s, 30 s and 60 s
    assert all(a["refused"] and "job 4.0" in a["reason"] for a in refused)
    assert barrier["pushed"] is True
    # The looping job cost three counter polls and three edits; the neighbour's barrier was edited first.
    assert len(polls) == 4
    assert [job for job, _ in schedd.edits] == ["5.0", "4.0", "4.0", "4.0"]


def test_urgent_work_overtakes_queued_routine_work_and_runs_between_a_rounds_jobs():
    q = PushQueue()
    busy, order = threading.Event(), []
    q.submit(busy.wait, 30)
    routine = [q.submit(order.append, f"routine {i}") for i in range(3)]
    urgent = q.submit_at(URGENT, order.append, "barrier")
    busy.set()
    for f in [*routine, urgent]:
        f.result(30)
    assert order == ["barrier", "routine 0", "routine 1", "routine 2"]

    # Inside a long routine task (a periodic round), run_urgent serves a barrier queued meanwhile.
    order.clear()
    started, go_on = threading.Event(), threading.Event()

    def round_of_pushes():
        order.append("job 1")
        started.set()
        go_on.wait(30)
        q.run_urgent()
        order.append("job 2")
    rnd = q.submit_at(ROUTINE, round_of_pushes)
    started.wait(30)
    later = q.submit(order.append, "next round")
    barrier = q.submit_at(URGENT, order.append, "barrier")
    go_on.set()
    for f in (rnd, later, barrier):
        f.result(30)
    assert order == ["job 1", "barrier", "job 2", "next round"]
    q.run_urgent()   # from another thread: does nothing (only the push thread runs work)


def test_one_edit_per_push_with_every_attribute_then_only_what_changed():
    schedd = FakeSchedd()
    p = AdPusher(edit=schedd.edit)
    plan = {"network_type": "nat", "ipv4": "10.77.0.2", "rate_limit_mbit": 100}
    usage = {"bytes_in": 2_000_000, "bytes_out": 5, "packets_in": 3, "packets_out": 1, "avg_in_bps": 8.0}
    assert p.push("slot1", "ap#4.0#1", "4.0", {"plan": plan, "usage": usage})
    every = job_attributes({"plan": plan, "usage": usage})
    assert len(schedd.edits) == 1 and schedd.edits[0][1] == every
    assert {"LarkNetworkType", "LarkIPv4Address", "NetworkIncomingBytes", "NetworkInputMb"} <= set(every)
    assert p.push("slot1", "ap#4.0#1", "4.0", {"plan": plan, "usage": usage})      # nothing moved: no edit
    assert len(schedd.edits) == 1
    moved = dict(usage, bytes_in=3_000_000, packets_in=4, avg_in_bps=9.0)
    assert p.push("slot1", "ap#4.0#1", "4.0", {"plan": plan, "usage": moved})
    assert len(schedd.edits) == 2
    assert set(schedd.edits[1][1]) == {"NetworkIncomingBytes", "NetworkIncomingPackets", "NetworkInputMb",
                                       "NetworkIncomingAvgRate"}
    # The slot's next job gets every attribute again.
    assert p.push("slot1", "ap#6.0#1", "6.0", {"plan": plan, "usage": moved})
    assert len(schedd.edits) == 3 and schedd.edits[2][1] == job_attributes({"plan": plan, "usage": moved})


@pytest.mark.parametrize("n_bytes", [0, 1, 999_999, 1_000_000, 123_456_789, 10**13 + 7])
def test_network_mb_attributes_are_the_same_bytes_in_htcondors_mb(n_bytes):
    attrs = job_attributes({"usage": {"bytes_in": n_bytes, "bytes_out": n_bytes * 3 + 1}})
    assert round(float(attrs["NetworkInputMb"]) * 1_000_000) == int(attrs["NetworkIncomingBytes"]) == n_bytes
    assert round(float(attrs["NetworkOutputMb"]) * 1_000_000) == int(attrs["NetworkOutgoingBytes"])
    assert float(attrs["NetworkInputMb"]) == pytest.approx(n_bytes / 1e6)   # MB of 10^6 bytes, not MiB


def test_the_schedd_is_located_once_and_again_after_a_failed_edit(monkeypatch):
    located, edited, fail = [], [], [False]

    class Collector:
        def locate(self, daemon_type, name=None):
            located.append(name)
            return {"Name": name}

    class Schedd:
        def __init__(self, loc):
            self.loc = loc

        def edit(self, job_id, attr, value):
            if fail[0]:
                raise OSError("schedd moved")
            edited.append((job_id, attr, value))
            return 1

    fake = types.SimpleNamespace(Collector=Collector, Schedd=Schedd, DaemonType=types.SimpleNamespace(Schedd=1))
    monkeypatch.setitem(sys.modules, "htcondor2", fake)
    monkeypatch.setitem(sys.modules, "classad2", types.SimpleNamespace(ExprTree=str))
    monkeypatch.setattr(adpush, "_schedd_locations", {})
    adpush.htcondor_edit("ap", "4.0", {"NetworkInputMb": "1.000000", "NetworkIncomingBytes": "1000000"})
    adpush.htcondor_edit("ap", "4.0", {"NetworkIncomingBytes": "2000000"})
    assert located == ["ap"] and len(edited) == 3
    fail[0] = True
    with pytest.raises(OSError):
        adpush.htcondor_edit("ap", "4.0", {"NetworkIncomingBytes": "3000000"})
    fail[0] = False
    adpush.htcondor_edit("ap", "4.0", {"NetworkIncomingBytes": "3000000"})
    assert located == ["ap", "ap"]

