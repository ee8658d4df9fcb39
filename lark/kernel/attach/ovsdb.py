"""OVSDB for the OVS attach mode through ovsdbapp: one long-lived connection per larkd instead of an ovs-vsctl
process per job (each cost ~11 ms, most of it ovs-vsctl waiting for ovs-vswitchd; measured here, shared machine).

ovs-vsctl waited for ovs-vswitchd to apply every change; a transaction here returns once ovsdb-server commits it,
so a job's port asks for its OpenFlow number (ofport_request), its flows go in by that number while ovs-vswitchd
adds the port, and `wait_ofport` then waits for the port itself (usually there already). Reads come from the
connection's local replica of the tables, without a round trip.
"""
from __future__ import annotations

import logging
import os
import threading
import time
import warnings

from ...errors import LarkError

log = logging.getLogger(__name__)
TABLES = ("Open_vSwitch", "Bridge", "Port", "Interface")  # only what the mode uses is replicated in memory
TIMEOUT_S = 10.0
FIRST_JOB_OFPORT = 1000  # below: the uplink and anything an admin adds by hand get OVS's own numbers
MAX_OFPORT = 0xFF00       # OpenFlow's last physical port number


class Ovsdb:
    def __init__(self, remote: str, timeout: float = TIMEOUT_S, tables: tuple[str, ...] = TABLES):
        self.remote = remote
        self.timeout = timeout
        self.tables = tables                  # replicated in memory (the controller's queues add QoS and Queue)
        self._api = None
        self._lock = threading.Lock()        # the connection, made once
        self._ofport_lock = threading.Lock()  # two setups never pick the same number
        self._requested: dict[str, int] = {}  # job key -> ofport_request of its port, until it is detached

    def reachable(self) -> bool:
        """False when a unix: remote has no socket (OVS not running here): nothing to ask, nothing to wait for."""
        return not self.remote.startswith("unix:") or os.path.exists(self.remote[len("unix:"):])

    @property
    def api(self):
        return self.connect()

    def connect(self):
        """The connection to the OVSDB server, made on first use (importing ovsdbapp and reading the tables takes
        a few hundred ms): LarkError when it cannot be reached."""
        with self._lock:
            if self._api is None:
                self._api = self._connect()
            return self._api

    def _connect(self):
        with warnings.catch_warnings():
            # python-ovs imports eventlet where it is installed (os-ken brings it) and eventlet warns on import.
            warnings.simplefilter("ignore")
            from ovsdbapp.backend.ovs_idl import connection
            from ovsdbapp.schema.open_vswitch import impl_idl
        try:
            idl = connection.OvsdbIdl.from_server(self.remote, "Open_vSwitch", helper_tables=self.tables)
            conn = connection.Connection(idl=idl, timeout=self.timeout)
            return impl_idl.OvsdbIdl(conn)
        except Exception as e:  # ovsdbapp raises bare Exception when the server cannot be reached
            raise LarkError(f"cannot reach OVSDB: {e}", obj=f"ovs_db {self.remote}",
                            fix="start ovsdb-server and ovs-vswitchd (systemctl start openvswitch-switch), or point "
                            "the setting that names this socket (LARK_OVS_DB, the controller's [wan] ovsdb) at it",
                            ) from None

    def run(self, what: str, *commands, wait: bool = True):
        """Run commands in one transaction; the last command's result. `wait`: until ovs-vswitchd has applied it
        (as ovs-vsctl does); without, once ovsdb-server has committed it."""
        api = self.api
        try:
            txn = api.create_transaction(check_error=True) if wait else \
                _no_wait_transaction()(api, api.ovsdb_connection, check_error=True)
            with txn:
                for c in commands:
                    txn.add(c)
            return commands[-1].result if commands else None
        except LarkError:
            raise
        except Exception as e:
            raise LarkError(f"OVSDB transaction failed: {e}", obj=what,
                            fix="check ovs-vswitchd's log and `ovs-vsctl show`") from None

    def rows(self, table: str) -> list:
        """The rows of a table in the local replica (no round trip), read under the connection's lock."""
        api = self.api
        with api.ovsdb_connection.lock:
            return list(api.tables[table].rows.values())

    def bridge_ports(self, bridge: str) -> set[str] | None:
        """Names of a bridge's ports from the replica; None when the bridge does not exist."""
        for br in self.rows("Bridge"):
            if br.name == bridge:
                return {p.name for p in br.ports}
        return None

    def request_ofport(self, key: str) -> int:
        """An OpenFlow port number for a new job port, free in the switch and among this larkd's requests: set
        as the Interface's ofport_request, it lets the job's flows go in (ovs-ofctl, by number) while
        ovs-vswitchd is still adding the port, instead of after."""
        with self._ofport_lock:
            if key in self._requested:
                return self._requested[key]
            used = set(self._requested.values())
            for iface in self.rows("Interface"):
                used.update(v for v in (_optional(iface.ofport), _optional(iface.ofport_request)) if v)
            n = next(i for i in range(FIRST_JOB_OFPORT, MAX_OFPORT) if i not in used)
            self._requested[key] = n
            return n

    def forget_ofport(self, key: str) -> None:
        with self._ofport_lock:
            self._requested.pop(key, None)

    def wait_ofport(self, port: str, job: str) -> int:
        """The OpenFlow port number ovs-vswitchd gave `port`, once it has it (so the job's frames are switched)."""
        deadline = time.monotonic() + self.timeout
        while True:
            row = next((i for i in self.rows("Interface") if i.name == port), None)
            ofport = _optional(row.ofport) if row is not None else None
            error = _optional(row.error) if row is not None else None
            if ofport == -1 or error:
                raise LarkError(f"Open vSwitch could not add the port: {error or 'ofport -1'}",
                                job=job, obj=f"OVS port {port}", fix="see ovs-vswitchd's log")
            if ofport:
                return int(ofport)
            if time.monotonic() > deadline:
                raise LarkError(f"ovs-vswitchd did not take the port within {self.timeout:.0f} s", job=job,
                                obj=f"OVS port {port}", fix="check that ovs-vswitchd runs (ovs-vsctl show)")
            time.sleep(0.001)


def _no_wait_transaction():
    """ovsdbapp's Open_vSwitch transaction without its wait for ovs-vswitchd (it bumps next_cfg and polls cur_cfg,
    as ovs-vsctl does, even for reads)."""
    from ovsdbapp.backend.ovs_idl.transaction import Transaction
    from ovsdbapp.schema.open_vswitch.impl_idl import OvsVsctlTransaction

    class NoWaitTransaction(OvsVsctlTransaction):
        def pre_commit(self, txn):
            txn.expected_ifaces = set()  # add_port records its interfaces here

        def post_commit(self, txn):
            Transaction.post_commit(self, txn)
    return NoWaitTransaction


def _optional(value):
    """An optional OVSDB column's value, None when unset (ovsdbapp reads an unset one as [])."""
    if isinstance(value, list):
        return value[0] if value else None
    return value
