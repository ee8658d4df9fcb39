"""Issue 15 part B: OVS mode's OVSDB client (ovsdbapp) error paths and OpenFlow port numbers, against fakes."""
import threading
from types import SimpleNamespace

import pytest

from lark.errors import LarkError
from lark.kernel.attach import ovsdb
from lark.kernel.attach.ovsdb import Ovsdb


class FakeApi:
    def __init__(self, interfaces):
        self.ovsdb_connection = SimpleNamespace(lock=threading.RLock())
        self.tables = {"Interface": SimpleNamespace(rows={i: r for i, r in enumerate(interfaces)}),
                       "Bridge": SimpleNamespace(rows={})}


def iface(name, ofport=None, request=None, error=None):
    # ovsdbapp reads an unset optional column as []
    opt = lambda v: [] if v is None else [v]  # noqa: E731
    return SimpleNamespace(name=name, ofport=opt(ofport), ofport_request=opt(request), error=opt(error))


def db_with(*interfaces) -> Ovsdb:
    db = Ovsdb("unix:/nonexistent/db.sock", timeout=0.05)
    db._api = FakeApi(list(interfaces))
    return db


def test_ofport_requests_skip_numbers_in_use_and_stay_per_job_until_forgotten():
    db = db_with(iface("up0", ofport=1), iface("lk-a", ofport=1000), iface("lk-b", ofport=1002, request=1001))
    first = db.request_ofport("c")
    assert first == 1003                      # 1000-1002 are taken by a port or a port's request
    assert db.request_ofport("c") == first    # the same job asks again (secure after attach)
    assert db.request_ofport("d") == 1004     # requested but not yet in OVSDB still counts as taken
    db.forget_ofport("c")
    assert db.request_ofport("e") == 1003


def test_wait_ofport_reports_the_switch_refusing_the_port_by_name():
    db = db_with(iface("lk-a", ofport=-1, error="could not open network device lk-a (No such device)"))
    with pytest.raises(LarkError, match="could not add the port.*No such device") as e:
        db.wait_ofport("lk-a", "7.0")
    assert "lk-a" in str(e.value) and "7.0" in str(e.value)


def test_wait_ofport_times_out_with_a_fix_when_vswitchd_never_takes_the_port():
    db = db_with(iface("lk-a"))
    with pytest.raises(LarkError, match="did not take the port") as e:
        db.wait_ofport("lk-a", "7.0")
    assert "ovs-vswitchd runs" in str(e.value)


def test_wait_ofport_returns_the_number_once_set():
    assert db_with(iface("lk-a", ofport=1007)).wait_ofport("lk-a", "7.0") == 1007


def test_unreachable_ovsdb_is_a_clear_error_and_no_ports_for_gc(tmp_path):
    db = Ovsdb(f"unix:{tmp_path}/missing.sock")
    assert not db.reachable()
    with pytest.raises(LarkError, match="cannot reach OVSDB") as e:
        db.api
    assert "missing.sock" in str(e.value) and "LARK_OVS_DB" in str(e.value)


def test_bridge_ports_from_the_replica():
    db = db_with()
    port = SimpleNamespace(name="lk-a")
    db._api.tables["Bridge"].rows = {1: SimpleNamespace(name="lkovs0", ports=[port])}
    assert db.bridge_ports("lkovs0") == {"lk-a"}
    assert db.bridge_ports("other") is None


def test_optional_column_values():
    assert ovsdb._optional([]) is None and ovsdb._optional([5]) == 5 and ovsdb._optional(7) == 7
