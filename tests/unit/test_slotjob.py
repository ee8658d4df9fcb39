"""A slot's job in larkd's memory (lark/daemon/slotjob.py): created on first use, kept by a non-final release,
dropped in one place by the final one (the slot's lock outlives it). The kernel is the in-memory fake."""
import asyncio
import json
import os

from lark.daemon import server as server_mod
from lark.daemon.peercred import Peer, start_time
from lark.daemon.slotjob import Check, Pushed, PushRequest, SlotJobs
from test_daemon_dispatch import ME, _daemon


class FakeLoop:
    def __init__(self):
        self.removed = []

    def remove_reader(self, fd):
        self.removed.append(fd)


def _closed(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return True
    return False


def test_a_slots_job_is_created_on_first_use_and_is_the_same_object_after():
    jobs = SlotJobs()
    assert jobs.peek("slot1") is None and len(jobs) == 0
    job = jobs.get("slot1")
    assert job.key == "slot1" and jobs.get("slot1") is job and jobs.peek("slot1") is job
    assert (job.watch, job.session_netns, job.check, job.pushed, job.push_request, job.barrier) == (None,) * 6
    assert jobs.get("slot2") is not job and len(jobs) == 2 and {j.key for j in jobs} == {"slot1", "slot2"}


def test_end_drops_the_jobs_state_closes_its_watch_and_keeps_the_slots_lock():
    jobs = SlotJobs()
    loop = FakeLoop()
    assert jobs.end("slot1", loop) is None       # nothing to end: nothing is created
    assert jobs.peek("slot1") is None
    job = jobs.get("slot1")
    r, w = os.pipe()
    os.close(w)
    job.watch, job.session_netns, job.barrier = r, 4026531999, "3.0"
    job.pushed, job.push_request = Pushed("3.0", 10.0, 2), PushRequest("3.0", 11.0)
    job.check = Check(100, 7, 12.0, {"job_id": "3.0"})    # the ended starter's own check
    ended = jobs.end("slot1", loop, (100, 7))
    assert ended is job and loop.removed == [r] and _closed(r) and job.watch is None
    assert ended.session_netns == 4026531999        # what the release still needs from it
    fresh = jobs.peek("slot1")
    assert fresh is not job and fresh.lock is job.lock
    assert (fresh.watch, fresh.session_netns, fresh.check, fresh.pushed, fresh.push_request, fresh.barrier) == \
        (None,) * 6


def test_end_keeps_a_check_that_another_starter_made():
    """PREPARE_JOB of the slot's next job may come before the previous job's end is handled: its check stays."""
    jobs = SlotJobs()
    nxt = Check(101, 8, 12.0, {"job_id": "4.0"})
    jobs.get("slot1").check = nxt
    jobs.end("slot1", FakeLoop(), (100, 7))
    assert jobs.get("slot1").check is nxt
    jobs.end("slot1", FakeLoop(), None)               # no pin: nothing says whose it is, so it stays
    assert jobs.get("slot1").check is nxt
    jobs.end("slot1", FakeLoop(), (101, 8))           # its own starter's end: gone
    assert jobs.get("slot1").check is None


def test_larkd_keeps_a_jobs_state_through_a_non_final_release_and_drops_it_at_the_final_one(tmp_path, monkeypatch):
    d, k = _daemon(tmp_path, monkeypatch)   # job 3.0 on slot1, its starter this test process
    start = start_time(ME)
    killed_in = []
    monkeypatch.setattr(server_mod.ssh_session, "kill_leftovers", lambda ino: killed_in.append(ino) or [])
    nxt = Check(ME, start + 1, 0.0, {"job_id": "4.0"})   # the slot's next starter asked already

    async def flow():
        d.loop = asyncio.get_running_loop()
        assert json.loads(await d.dispatch({"op": "setup"}, Peer(pid=ME, uid=1000, gid=1000)))["ok"]
        job = d.jobs.peek("slot1")
        watch = job.watch
        assert watch is not None and os.readlink(f"/proc/self/fd/{watch}") == "anon_inode:[pidfd]"
        job.session_netns, job.barrier, job.check = 4026531999, "3.0", nxt
        job.pushed, job.push_request = Pushed("3.0", 1.0, 2), PushRequest("3.0", 2.0)
        lock = d._lock("slot1")
        # root releases the network while the starter runs: not final, the job's state stays
        await d.dispatch({"op": "release", "slot": "slot1"}, Peer(pid=ME, uid=0, gid=0))
        assert d.jobs.peek("slot1") is job and job.watch == watch and job.session_netns == 4026531999
        assert (job.barrier, job.check, job.push_request) == ("3.0", nxt, PushRequest("3.0", 2.0))
        assert killed_in == [] and d.pins.load("slot1") is not None
        # the starter exits: the final release
        await d.release("slot1", "starter exited", final=True, starter=(ME, start))
        fresh = d.jobs.peek("slot1")
        return job, watch, lock, fresh

    job, watch, lock, fresh = asyncio.run(flow())
    assert fresh is not job and fresh.lock is lock                        # the slot's lock outlives its job
    assert (fresh.watch, fresh.session_netns, fresh.pushed, fresh.push_request, fresh.barrier) == (None,) * 5
    assert fresh.check is nxt                                             # the next job's check is not its
    assert job.watch is None and (_closed(watch) or os.readlink(f"/proc/self/fd/{watch}") != "anon_inode:[pidfd]")
    assert killed_in == [4026531999]                                      # its ssh sessions' leftovers, once
    assert d.pins.load("slot1") is None and k.objects == set() and d.active == set()
