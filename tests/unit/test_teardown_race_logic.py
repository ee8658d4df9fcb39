"""A slot's next job while larkd still tears down the previous one in the background (issue 15): the setup
waits for the teardown in progress, or the late release of the old starter leaves the new job alone."""
import asyncio
import os
import threading

from helpers.fakekernel import fake_networker
from lark.daemon import server as server_mod
from lark.daemon.peercred import Peer, StarterInfo, start_time
from lark.plan import NetworkPlan

ME = os.getpid()
OLD = StarterInfo(pid=ME, start=start_time(ME), slot="slot1", exe="/usr/sbin/condor_starter", argv=[])
NEW = StarterInfo(pid=ME, start=start_time(ME) + 1, slot="slot1", exe="/usr/sbin/condor_starter", argv=[])
JOB = Peer(pid=ME, uid=1000, gid=1000)


def _daemon(tmp_path, monkeypatch):
    net, k = fake_networker(str(tmp_path), monkeypatch, ad_source="files", ad_dir=str(tmp_path / "ads"))
    d = server_mod.Larkd(net.cfg)
    d.fw, d.net, d.records, d.acct, d.finished = net.fw, net, net.records, net.acct, net.finished
    current = {"starter": OLD}
    monkeypatch.setattr(server_mod.peercred, "authorize_job", lambda who, paths, *inodes: (current["starter"], 4242))
    monkeypatch.setattr(d, "plan_for", lambda st, key: NetworkPlan(
        job_id="1.0" if st is OLD else "2.0", slot=st.slot, key=key))
    monkeypatch.setattr(d, "watch", lambda key, pid, start: None)  # the starters here are this test process
    # The teardown blocks in its worker thread until released: the window a next setup can arrive in.
    gate = threading.Event()
    entered = threading.Event()
    real_teardown = d.net.teardown

    def slow_teardown(*a, **kw):
        entered.set()
        assert gate.wait(10), "the test never let the teardown go on"
        return real_teardown(*a, **kw)
    monkeypatch.setattr(d.net, "teardown", slow_teardown)
    return d, k, current, gate, entered


def test_setup_waits_for_the_background_teardown_in_progress(tmp_path, monkeypatch):
    d, k, current, gate, entered = _daemon(tmp_path, monkeypatch)

    async def flow():
        d.loop = asyncio.get_running_loop()
        await d.dispatch({"op": "setup"}, JOB)
        # The old starter exits: its release starts and blocks inside the teardown.
        release = d.loop.create_task(d.release("slot1", "starter exited", final=True, starter=(OLD.pid, OLD.start)))
        await d.loop.run_in_executor(None, entered.wait, 10)
        current["starter"] = NEW
        setup = d.loop.create_task(d.dispatch({"op": "setup"}, JOB))
        await asyncio.sleep(0.1)
        waited = not setup.done()   # held back while the old network is still being removed
        gate.set()
        await release
        return waited, await setup

    waited, answer = asyncio.run(flow())
    assert waited
    assert b'"ok":true' in answer
    rec = d.records.load("slot1")
    assert rec.job_id == "2.0" and rec.phase == "ready" and rec.starter_start == NEW.start
    old = d.finished.latest_for_key("slot1")
    assert old["job_id"] == "1.0" and old["reason"] == "starter exited"
    assert d.pins.load("slot1").same_starter(NEW.pid, NEW.start)
    assert d.active == {"slot1"}
    assert k.of_key("slot1")  # the new job's network exists


def test_late_release_of_the_old_starter_leaves_the_next_job_alone(tmp_path, monkeypatch):
    d, k, current, gate, entered = _daemon(tmp_path, monkeypatch)
    gate.set()  # teardowns run at once here

    async def flow():
        d.loop = asyncio.get_running_loop()
        await d.dispatch({"op": "setup"}, JOB)
        # The next job's setup comes before larkd noticed the old starter's exit: the old network goes first.
        current["starter"] = NEW
        answer = await d.dispatch({"op": "setup"}, JOB)
        objects = set(k.of_key("slot1"))
        # Then the old starter's exit is noticed: nothing of the new job may go.
        late = await d.release("slot1", "starter exited", final=True, starter=(OLD.pid, OLD.start))
        return answer, objects, late

    answer, objects, late = asyncio.run(flow())
    assert b'"ok":true' in answer and late is None
    assert d.records.load("slot1").job_id == "2.0" and d.active == {"slot1"}
    assert set(k.of_key("slot1")) == objects and objects
    old = d.finished.latest_for_key("slot1")
    assert old["job_id"] == "1.0" and old["reason"] == "replaced by a new job"
