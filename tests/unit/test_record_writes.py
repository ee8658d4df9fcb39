"""When a job's record reaches the disk (lark/daemon/records.py, crash_view): while the job is setting up, only a
change a restart after a crash reads is written; "ready", "tearing-down" and every later save always are."""
from __future__ import annotations

import dataclasses
import json
import os

import pytest

from lark.daemon.records import JobRecord, RecordStore
from lark.plan import JobNetwork, NetworkPlan


def _rec(job_id: str = "7.0") -> JobRecord:
    plan = NetworkPlan(job_id=job_id, slot="slot1", key="slot1", network_type="nat", rate_limit_mbit=10.0)
    return JobRecord(key="slot1", slot="slot1", job_id=job_id, starter_pid=10, starter_start=20, job_pid=11,
                     netns_inode=99, netns="lark-slot1", host_if="lk-slot1", plan=JobNetwork(plan).to_dict())


def _on_disk(store: RecordStore, key: str = "slot1") -> dict:
    with open(store.path(key)) as f:
        return json.load(f)


@pytest.fixture
def store(tmp_path) -> RecordStore:
    return RecordStore(str(tmp_path / "records"))


def test_a_setting_up_record_is_written_first_then_only_for_what_a_crash_needs(store: RecordStore) -> None:
    rec = _rec()
    assert store.save(rec), "the first save (before any kernel object) must write"
    first = _on_disk(store)
    assert first["phase"] == "setting-up"
    # Addresses and the port are locks named by the key; the limit goes with the veth; DNS revocation with the job.
    rec.plan = JobNetwork.from_dict(rec.plan).with_addresses(ipv4="10.0.0.2", gateway4="10.0.0.1", ipv4_prefix=32,
                                                             inbound_port=20001).to_dict()
    rec.plan = {**rec.plan, "rate_limit_mbit": 5.0}
    rec.shaped = True
    assert not store.save(rec)
    rec.rebalanced_mbit = 6.0   # another job's rebalance moved its limit: goes with the veth too
    assert not store.save(rec)
    assert _on_disk(store) == first
    assert store.load("slot1") is rec  # memory has it all
    # The DHCP lease is what teardown releases at the server: written at once.
    rec.plan = {**rec.plan, "dhcp": {"address": "10.0.0.2", "server": "10.0.0.1"}}
    assert store.save(rec)
    assert _on_disk(store)["plan"]["dhcp"] == rec.plan["dhcp"]
    # Ready: everything, so a restart adopts the job as built.
    rec.phase = "ready"
    assert store.save(rec)
    assert _on_disk(store) == json.loads(json.dumps(dataclasses.asdict(rec)))
    assert _on_disk(store)["plan"]["ipv4"] == "10.0.0.2" and _on_disk(store)["shaped"] is True
    # Once ready, every save writes (a rebalance's new limit, a renewed lease), and so does the teardown mark.
    rec.rebalanced_mbit = 7.0
    assert store.save(rec) and _on_disk(store)["rebalanced_mbit"] == 7.0
    rec.renewed_lease = {"address": "10.0.0.2", "server": "10.0.0.1", "obtained": 1.0}
    assert store.save(rec) and _on_disk(store)["renewed_lease"]["obtained"] == 1.0
    rec.phase = "tearing-down"
    assert store.save(rec) and _on_disk(store)["phase"] == "tearing-down"
    assert store.save(rec)


@pytest.mark.parametrize("field,value", [("network_type", "bridge"), ("owner", "mallory"),
                                         ("fair_share_capacity_mbit", 100.0)])
def test_any_other_plan_change_while_setting_up_is_written(store: RecordStore, field: str, value: object) -> None:
    """Fields not known to be found by the key (the network type names the mode teardown detaches from; anything
    added later) are written: the skipping errs on the side of writing."""
    rec = _rec()
    store.save(rec)
    rec.plan = {**rec.plan, field: value}
    assert store.save(rec)
    assert _on_disk(store)["plan"][field] == value


def test_the_next_job_of_the_slot_writes_its_first_record(store: RecordStore) -> None:
    old = _rec("7.0")
    store.save(old)
    store.delete("slot1")
    assert not os.path.exists(store.path("slot1"))
    new = _rec("7.0")   # the same job id again (a restarted job) still gets its file
    assert store.save(new)
    assert _on_disk(store)["job_id"] == "7.0"
    newer = _rec("8.0")  # a record replacing another without a delete (the key's previous job's) too
    assert store.save(newer)
    assert _on_disk(store)["job_id"] == "8.0"


def test_a_fresh_store_reads_what_was_written(store: RecordStore, tmp_path) -> None:
    """A restart after a crash mid-setup: the record it reads is the last write, the job's identity and plan."""
    rec = _rec()
    store.save(rec)
    rec.plan = {**rec.plan, "ipv4": "10.0.0.2"}
    store.save(rec)
    again = RecordStore(str(tmp_path / "records")).load("slot1")
    assert again is not None and again.phase == "setting-up" and again.job_id == "7.0"
    assert again.plan["network_type"] == "nat" and again.plan["ipv4"] is None
