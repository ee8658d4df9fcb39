"""larkd's side of the pool's SDN controller: register a bridged job (and wait for the controller's acknowledgement
that its flows are on the switch) before the job's program starts, remove it at teardown, and resync this EP's full
job list periodically, so that a restarted controller rebuilds its view. Mutual TLS with the stdlib."""
from __future__ import annotations

import http.client
import json
import logging
import ssl
import threading
from typing import Any
from urllib.parse import quote, urlsplit

from ..config import Config
from ..errors import LarkError
from ..names import JobNames
from ..plan import JobNetwork
from .records import RecordStore

log = logging.getLogger(__name__)
BRIDGED_TYPES = ("bridge", "ovs_bridge")   # NAT jobs share the EP's address: the core switch cannot tell them apart


def registration(plan: JobNetwork | dict, mac: str) -> dict:
    p = plan if isinstance(plan, dict) else plan.to_dict()  # a JobNetwork: the plan and its addresses
    return {"key": p["key"], "job_id": p["job_id"], "owner": p.get("owner", ""),
            "accounting_group": p.get("accounting_group", ""),
            "addresses": [a for a in (p.get("ipv4"), p.get("ipv6")) if a], "mac": mac,
            "vlan": p.get("vlan") if isinstance(p.get("vlan"), int) else None,
            "request_bandwidth_mbit": p.get("request_bandwidth_mbit") or 0.0, "attrs": p.get("job_attrs") or {}}


class ControllerClient:
    def __init__(self, cfg: Config, records: RecordStore):
        self.cfg = cfg
        self.records = records
        self.enabled = bool(cfg.controller_url)
        self._ctx: ssl.SSLContext | None = None
        self._stop = threading.Event()
        # Registrations and resyncs take turns, and jobs registered but not yet "ready" count as this EP's, so a
        # resync can never remove a job whose setup is just finishing.
        self._lock = threading.Lock()
        self._registered: set[str] = set()
        self._conn: http.client.HTTPSConnection | None = None
        url = urlsplit(cfg.controller_url)
        self.host, self.port = url.hostname or "", url.port or 443

    def _context(self) -> ssl.SSLContext:
        if self._ctx is None:
            try:
                ctx = ssl.create_default_context(cafile=self.cfg.controller_ca)
                ctx.load_cert_chain(self.cfg.controller_cert, self.cfg.controller_key)
                # The chain is still verified (CERT_REQUIRED); the name is checked in _check_peer, which also
                # accepts the controller's certificate name, so an address in controller_url needs no IP SAN.
                ctx.check_hostname = False
            except (OSError, ssl.SSLError) as e:
                raise LarkError(f"cannot load this EP's TLS files: {e}",
                                obj=f"controller_ca/controller_cert/controller_key ({self.cfg.controller_cert})",
                                fix="copy ca.pem and this EP's NAME.pem/NAME.key from `lark-controller certs`") \
                    from None
            self._ctx = ctx
        return self._ctx

    def _check_peer(self, sock: ssl.SSLSocket) -> None:
        cert: dict[str, Any] = sock.getpeercert() or {}  # its values' shapes differ by key
        names = {v for rdn in cert.get("subject", ()) for k, v in rdn if k == "commonName"}
        names |= {v for k, v in cert.get("subjectAltName", ()) if k in ("DNS", "IP Address")}
        if self.cfg.controller_name not in names and self.host not in names:
            raise ssl.SSLError(f"the certificate at {self.host}:{self.port} names {sorted(names)}, neither "
                               f"controller_name {self.cfg.controller_name!r} nor {self.host!r}: not the controller")

    def _call(self, method: str, path: str, body: object = None) -> tuple[int, dict]:
        """One request on the kept-alive connection (callers hold self._lock); a connection the controller closed
        meanwhile (idle timeout, restart) is replaced once. Saves a TLS handshake per job."""
        data = json.dumps(body).encode() if body is not None else None
        for _ in range(2):
            fresh = self._conn is None
            if self._conn is None:
                conn = http.client.HTTPSConnection(self.host, self.port, context=self._context(),
                                                   timeout=self.cfg.controller_timeout)
                try:
                    conn.connect()
                    self._check_peer(conn.sock)
                except BaseException:
                    conn.close()
                    raise
                self._conn = conn
            conn = self._conn
            try:
                conn.request(method, path, body=data, headers={"Content-Type": "application/json"})
                r = conn.getresponse()
                raw = r.read()
            except (OSError, http.client.HTTPException):
                conn.close()
                self._conn = None
                if fresh:
                    raise
                continue   # the kept connection had gone stale: once more on a new one
            if r.will_close:
                conn.close()
                self._conn = None
            try:
                return r.status, json.loads(raw or b"{}")
            except ValueError:
                return r.status, {"error": f"HTTP {r.status} with a body that is not JSON"}
        raise OSError("no connection to the controller")  # not reached: the fresh attempt raises or returns

    def register(self, plan: JobNetwork, mac: str) -> dict:
        """Returns once the controller has acknowledged the job's flows, with its answer (the policies that chose the
        job: `blocked_by`, `wan_drop`, ...); on failure refuses the job (closed) or logs a warning (open) and
        returns {}."""
        if not self.enabled or plan.network_type not in BRIDGED_TYPES or not (plan.ipv4 or plan.ipv6):
            return {}
        try:
            with self._lock:
                code, body = self._call("POST", "/v1/jobs", registration(plan, mac))
                if code == 200:
                    self._registered.add(plan.key)
        except ssl.SSLCertVerificationError as e:
            return self._failed(plan.job_id, f"the controller's certificate was refused: {e.verify_message} "
                                "(is controller_ca the CA of `lark-controller certs`?)")
        except (OSError, ssl.SSLError, http.client.HTTPException) as e:
            return self._failed(plan.job_id, f"cannot reach it: {e}")
        except LarkError as e:  # this EP's TLS files
            return self._failed(plan.job_id, str(e))
        if code != 200:
            return self._failed(plan.job_id, body.get("error") or f"HTTP {code}")
        log.info("job %s registered with the controller: cookie %s, %s flows on %s switches (%s ms)", plan.job_id,
                 body.get("cookie"), body.get("flows_per_switch"), body.get("switches"), body.get("ms"))
        return body

    def _failed(self, job_id: str, why: str) -> dict:
        if self.cfg.controller_failure == "open":
            log.warning("job %s starts without the pool controller's flows (controller_failure = open): %s",
                        job_id, why)
            return {}
        raise LarkError(f"the pool's SDN controller did not acknowledge the job's flows: {why}", job=job_id,
                        obj=f"controller {self.cfg.controller_url}",
                        fix="check `lark-controller status` (is a switch connected?), or set "
                            'controller_failure = "open" to start jobs without it')

    def unregister(self, key: str, job_id: str) -> None:
        """Remove the job's flows; never fails teardown (the next resync removes what this call could not)."""
        if not self.enabled:
            return
        try:
            with self._lock:
                self._registered.discard(key)
                code, body = self._call("DELETE", f"/v1/jobs/{quote(key, safe='')}")
            if code != 200:
                log.warning("controller did not remove job %s: %s", job_id, body.get("error") or f"HTTP {code}")
        except (OSError, ssl.SSLError, http.client.HTTPException, LarkError) as e:
            log.warning("could not remove job %s from the controller (the next resync will): %s", job_id, e)

    def jobs(self) -> list[dict]:
        out = []
        for rec in self.records.all():
            live = rec.phase == "ready" or (rec.phase == "setting-up" and rec.key in self._registered)
            if live and rec.plan.get("network_type") in BRIDGED_TYPES and (
                    rec.plan.get("ipv4") or rec.plan.get("ipv6")):
                out.append(registration(rec.plan, JobNames(rec.key, self.cfg.netns_prefix).job_mac))
        return out

    def sync(self) -> bool:
        """Send this EP's full list of jobs; the controller drops every other job it holds for this EP."""
        try:
            with self._lock:
                code, body = self._call("PUT", "/v1/sync", {"jobs": self.jobs()})
        except (OSError, ssl.SSLError, http.client.HTTPException, LarkError) as e:
            log.warning("resync with the controller failed, will retry: %s", e)
            return False
        if code != 200:
            log.warning("controller refused the resync: %s", body.get("error") or f"HTTP {code}")
            return False
        if body.get("installed") or body.get("removed"):
            log.info("resync with the controller: %s jobs, %s (re)installed, %s removed", body.get("jobs"),
                     body.get("installed"), body.get("removed"))
        return True

    def start(self) -> None:
        """Resync at once (larkd has just started) and then every controller_resync seconds."""
        if self.enabled:
            threading.Thread(target=self._loop, name="lark-controller-sync", daemon=True).start()

    def _loop(self) -> None:
        while True:
            self.sync()
            if self._stop.wait(self.cfg.controller_resync):
                return

    def stop(self) -> None:
        self._stop.set()
