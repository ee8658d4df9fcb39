import json
import threading

import pytest

from lark.errors import LarkError
from lark.kernel.ipam import address_pool, port_pool
from lark.daemon.records import FinishedStore, JobRecord, RecordStore


def test_pool_skips_network_gateway_broadcast(tmp_path):
    pool = address_pool(str(tmp_path), "10.9.0.0/29")
    got = [pool.reserve(f"k{i}") for i in range(5)]
    assert got == [f"10.9.0.{i}" for i in range(2, 7)]
    with pytest.raises(LarkError, match="no free IPv4 addresses"):
        pool.reserve("k9", job="3.0")


def test_release_frees_and_is_safe_to_repeat(tmp_path):
    pool = address_pool(str(tmp_path), "10.9.0.0/29")
    a = pool.reserve("k1")
    assert list(pool.entries()) == [(a, "k1")]
    assert pool.release("k1") == [a]
    assert pool.release("k1") == []
    assert list(pool.entries()) == []
    # The pool continues after the last reservation instead of reusing a just-freed address at once.
    assert pool.reserve("k2") != a


def test_concurrent_reservations_never_collide(tmp_path):
    pool = address_pool(str(tmp_path), "10.9.0.0/24")
    out, errors = [], []

    def worker(i):
        try:
            out.append(pool.reserve(f"k{i}"))
        except Exception as e:  # pragma: no cover - the assertion below reports it
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(64)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and len(set(out)) == 64


def test_port_pool(tmp_path):
    pool = port_pool(str(tmp_path), 20000, 20001)
    assert {pool.reserve("a"), pool.reserve("b")} == {"20000", "20001"}
    with pytest.raises(LarkError, match="inbound ports"):
        pool.reserve("c")


def _rec(key="slot1"):
    return JobRecord(key=key, slot=key, job_id="1.0", starter_pid=1, starter_start=2, job_pid=3, netns_inode=4,
                     netns=f"lark-{key}", host_if=f"lk-{key}", plan={"ipv4": "10.0.0.2"})


def test_records_roundtrip_old_fields_and_corrupt_file(tmp_path):
    store = RecordStore(str(tmp_path))
    r = _rec()
    r.phase = "ready"
    store.save(r)
    assert store.load("slot1") == r
    # A record written by a former version (fields since removed) still loads, so its job is adopted.
    old = json.loads((tmp_path / "slot1.json").read_text())
    (tmp_path / "old.json").write_text(json.dumps({**old, "key": "old", "steps": ["netns"], "error": "",
                                                   "counters": {}}))
    assert store.load("old").plan == {"ipv4": "10.0.0.2"} and store.load("old").phase == "ready"
    store.delete("old")
    (tmp_path / "bad.json").write_text("{not json")
    assert store.load("bad") is None
    (tmp_path / "list.json").write_text("[1, 2]")
    assert store.load("list") is None
    store.delete("list")
    assert {x.key for x in store.all()} == {"slot1"}
    store.delete("slot1")
    store.delete("slot1")
    assert store.keys() == ["bad"]


def test_two_writers_of_one_record_keep_both_changes(tmp_path):
    """A job's setup marks its record ready while another job's fair-share rebalance changes its limit: the
    later save must not put back what the earlier one changed (a job stayed 'setting-up' for good)."""
    store = RecordStore(str(tmp_path))
    mine = _rec()
    mine.plan = {**mine.plan, "rate_limit_mbit": 400}
    store.save(mine)                         # the job's own setup, still setting up
    theirs = store.load("slot1")             # the rebalance of another job reads it...
    mine.phase = "ready"
    store.save(mine)                         # ...the setup finishes...
    theirs.rebalanced_mbit = 200
    store.save(theirs)                       # ...and the rebalance saves its change last
    fresh = RecordStore(str(tmp_path)).load("slot1")  # what a restarted larkd reads from disk
    assert (fresh.phase, fresh.rate_limit_mbit) == ("ready", 200)
    store.delete("slot1")
    nxt = _rec()                             # the slot's next job starts from its own record
    store.save(nxt)
    assert store.load("slot1") is nxt and store.load("slot1").phase == "setting-up"


def test_finished_store_prunes_and_finds_latest(tmp_path):
    fs = FinishedStore(str(tmp_path), keep=3)
    for i in range(5):
        fs.save("slot1" if i % 2 == 0 else "slot2", {"ended": 1000 + i, "n": i})
    assert len(fs.all()) == 3
    assert fs.latest_for_key("slot1")["n"] == 4
    assert fs.latest_for_key("slot9") is None
