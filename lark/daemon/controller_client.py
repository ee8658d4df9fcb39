"""larkd's side of the pool's SDN controller: register a bridged job (and wait for the controller's acknowledgement
that its flows are on the switch) before the job's program starts, remove it at teardown, and resync this EP's full
job list periodically, so that a restarted controller rebuilds its view. Mutual TLS with the stdlib.

High availability (issue 26, docs/controller.md "HA model"): `controller_url` may name several equal controllers.
Every request goes to each of them, in order per controller (one worker thread each); a job may start as soon as one
of them has acknowledged its flows. Every answer carries the controller's boot id, and each controller is polled
every HEALTH_INTERVAL: one that restarted (a new boot id) or answers again after a failure gets this EP's full job
list at once, before anything else is sent to it."""
from __future__ import annotations

import http.client
import json
import logging
import ssl
import threading
import time
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from typing import Any, Protocol
from urllib.parse import quote, urlsplit

from ..config import Config
from ..errors import LarkError
from ..kernel.attach import MODE_CLASSES
from ..names import JobNames
from ..plan import JobNetwork
from .records import RecordStore

log = logging.getLogger(__name__)
HEALTH_INTERVAL = 1.0   # seconds between health polls of each controller: a restart or a return is noticed this fast
RETRY_GAP = 0.25        # a controller that failed is tried by a request at most this often; else it fails at once
NET_ERRORS = (OSError, ssl.SSLError, http.client.HTTPException)


class ModeTraits(Protocol):
    """What the client asks of a job's network type (lark/daemon/profiles.py's Profile answers it; the attach mode
    decides): only bridged jobs register (NAT jobs share the EP's address: the core switch cannot tell them apart),
    and only a mode that tags labels says its job is `tagged`."""
    @property
    def bridged(self) -> bool: ...
    @property
    def tags_labels(self) -> bool: ...


def builtin_traits(network_type: str) -> ModeTraits | None:
    """The traits of lark/kernel/attach's own modes (class attributes), by network type (None: not one of them,
    e.g. `none`), for a client made without a JobNetworker's profiles."""
    return MODE_CLASSES.get(network_type)


def registration(plan: JobNetwork | dict, mac: str, tagged: bool = False) -> dict:
    p = plan if isinstance(plan, dict) else plan.to_dict()  # a JobNetwork: the plan and its addresses
    return {"key": p["key"], "job_id": p["job_id"], "owner": p.get("owner", ""),
            "accounting_group": p.get("accounting_group", ""),
            "addresses": [a for a in (p.get("ipv4"), p.get("ipv6")) if a], "mac": mac,
            "vlan": p.get("vlan") if isinstance(p.get("vlan"), int) else None,
            "request_bandwidth_mbit": p.get("request_bandwidth_mbit") or 0.0, "attrs": p.get("job_attrs") or {},
            # only a mode that tags labels (OVS) tags a job's frames with a label-scheme controller's label (issue
            # 26); a Linux-bridge job leaves untagged, so the controller gives it per-job flows on the core instead
            "tagged": tagged}


def controller_urls(cfg: Config) -> list[str]:
    """The controllers larkd talks to: controller_url, one URL or several separated by commas or spaces (HA)."""
    text = cfg.controller_url.replace(",", " ")
    return text.split()


class _Lane:
    """One controller: its kept-alive connection, the order of requests to it (a worker thread of its own when
    there are several controllers, the caller's thread under a lock when there is one), its last boot id, and
    whether it is up. A lane that failed, or whose controller restarted, resyncs before its next request."""

    def __init__(self, client: ControllerClient, url: str, threaded: bool):
        u = urlsplit(url)
        self.client, self.url = client, url
        self.host, self.port = u.hostname or "", u.port or 443
        self.conn: http.client.HTTPSConnection | None = None
        self.lock = threading.Lock()
        self.worker = ThreadPoolExecutor(1, thread_name_prefix="lark-controller-lane") if threaded else None
        self.boot: str | None = None
        self.down_at: float | None = None   # monotonic time of the last failure, while it is down
        self.need_sync = False
        self.polling = False

    def submit(self, fn: Callable[..., Any], *args: Any) -> Future:
        if self.worker is None:
            f: Future = Future()
            try:
                f.set_result(fn(*args))
            except Exception as e:
                f.set_exception(e)
            return f
        return self.worker.submit(fn, *args)

    # -- in the lane's turn ---------------------------------------------------------------------------------
    def request(self, method: str, path: str, body: object = None) -> tuple[int, dict]:
        with self.lock:
            if self.down_at is not None and time.monotonic() - self.down_at < RETRY_GAP:
                raise ConnectionError(f"controller {self.url} did not answer just before (it is tried again "
                                      f"every {RETRY_GAP} s and polled every {HEALTH_INTERVAL} s)")
            try:
                if self.need_sync:
                    self._sync()
                result = self._call(method, path, body)
                if self.need_sync:           # it restarted: this answer carried a new boot id
                    self._sync()
                return result
            except NET_ERRORS:
                self._down()
                raise

    def sync(self) -> bool:
        with self.lock:
            try:
                return self._sync()
            except NET_ERRORS as e:
                self._down()
                log.warning("resync with the controller %s failed, will retry: %s", self.url, e)
                return False

    def health(self) -> None:
        """The health poll: notices a restart (new boot id) or a return, and resyncs at once."""
        try:
            with self.lock:
                try:
                    self._call("GET", "/v1/health")
                    if self.need_sync:
                        self._sync()
                except NET_ERRORS as e:
                    if self.down_at is None:
                        log.warning("controller %s does not answer: %s (this EP resyncs it when it does)",
                                    self.url, e)
                    self._down()
        finally:
            self.polling = False

    def _down(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None
        self.down_at = time.monotonic()
        self.need_sync = True

    def _sync(self) -> bool:
        code, body = self._call("PUT", "/v1/sync", {"jobs": self.client.jobs()})
        if code != 200:
            log.warning("controller %s refused the resync: %s", self.url, body.get("error") or f"HTTP {code}")
            return False
        self.need_sync = False
        if body.get("installed") or body.get("removed"):
            log.info("resync with the controller %s: %s jobs, %s (re)installed, %s removed", self.url,
                     body.get("jobs"), body.get("installed"), body.get("removed"))
        return True

    def _call(self, method: str, path: str, body: object = None) -> tuple[int, dict]:
        """One request on the kept-alive connection (callers hold self.lock); a connection the controller closed
        meanwhile (idle timeout, restart) is replaced once. Saves a TLS handshake per job."""
        data = json.dumps(body).encode() if body is not None else None
        for _ in range(2):
            fresh = self.conn is None
            if self.conn is None:
                conn = http.client.HTTPSConnection(self.host, self.port, context=self.client._context(),
                                                   timeout=self.client.cfg.controller_timeout)
                try:
                    conn.connect()
                    self.client._check_peer(conn.sock, self.host, self.port)
                except BaseException:
                    conn.close()
                    raise
                self.conn = conn
            conn = self.conn
            try:
                conn.request(method, path, body=data, headers={"Content-Type": "application/json"})
                r = conn.getresponse()
                raw = r.read()
            except NET_ERRORS:
                conn.close()
                self.conn = None
                if fresh:
                    raise
                continue   # the kept connection had gone stale: once more on a new one
            if r.will_close:
                conn.close()
                self.conn = None
            self._answered(r.getheader("X-Lark-Boot"))
            try:
                return r.status, json.loads(raw or b"{}")
            except ValueError:
                return r.status, {"error": f"HTTP {r.status} with a body that is not JSON"}
        raise OSError("no connection to the controller")  # not reached: the fresh attempt raises or returns

    def _answered(self, boot: str | None) -> None:
        if self.down_at is not None:
            log.info("controller %s answers again: resyncing this EP's jobs there", self.url)
            self.down_at = None
            self.need_sync = True
        if boot and self.boot and boot != self.boot:
            log.warning("controller %s restarted (boot id %s, was %s): resyncing this EP's jobs there at once",
                        self.url, boot, self.boot)
            self.need_sync = True
        self.boot = boot or self.boot


class ControllerClient:
    def __init__(self, cfg: Config, records: RecordStore,
                 traits: Callable[[str], ModeTraits | None] = builtin_traits):
        """`traits`: a network type's traits (JobNetworker passes its profiles'; a new mode needs no change here)."""
        self.cfg = cfg
        self.records = records
        self.traits = traits
        self.enabled = bool(cfg.controller_url)
        self._ctx: ssl.SSLContext | None = None
        self._stop = threading.Event()
        # Jobs being registered count as this EP's from before the first request leaves: a resync (on any lane,
        # in any order) can never remove a job whose setup is just finishing.
        self._lock = threading.Lock()
        self._registered: set[str] = set()
        urls = controller_urls(cfg)
        self.lanes = [_Lane(self, u, threaded=len(urls) > 1) for u in urls]

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

    def _check_peer(self, sock: ssl.SSLSocket, host: str, port: int) -> None:
        cert: dict[str, Any] = sock.getpeercert() or {}  # its values' shapes differ by key
        names = {v for rdn in cert.get("subject", ()) for k, v in rdn if k == "commonName"}
        names |= {v for k, v in cert.get("subjectAltName", ()) if k in ("DNS", "IP Address")}
        if self.cfg.controller_name not in names and host not in names:
            raise ssl.SSLError(f"the certificate at {host}:{port} names {sorted(names)}, neither "
                               f"controller_name {self.cfg.controller_name!r} nor {host!r}: not the controller")

    def _why(self, lane: _Lane, f: Future) -> str:
        """Why a lane's request did not succeed, for the job's error (with the controller's URL when several)."""
        e = f.exception()
        if isinstance(e, ssl.SSLCertVerificationError):
            why = (f"the controller's certificate was refused: {e.verify_message} "
                   "(is controller_ca the CA of `lark-controller certs`?)")
        elif isinstance(e, LarkError):   # this EP's TLS files
            why = str(e)
        elif e is not None:
            why = f"cannot reach it: {e}"
        else:
            code, body = f.result()
            why = body.get("error") or f"HTTP {code}"
        return f"{lane.url}: {why}" if len(self.lanes) > 1 else why

    def _fan_out(self, method: str, path: str, body: object = None) -> list[tuple[_Lane, Future]]:
        return [(lane, lane.submit(lane.request, method, path, body)) for lane in self.lanes]

    def register(self, plan: JobNetwork, mac: str) -> dict:
        """Returns once a controller has acknowledged the job's flows, with its answer (the policies that chose the
        job: `blocked_by`, `wan_drop`, ...); on failure refuses the job (closed) or logs a warning (open) and
        returns {}."""
        traits = self.traits(plan.network_type)
        if not self.enabled or traits is None or not traits.bridged or not (plan.ipv4 or plan.ipv6):
            return {}
        with self._lock:
            self._registered.add(plan.key)
        sent = self._fan_out("POST", "/v1/jobs", registration(plan, mac, traits.tags_labels))
        pending = {f for _, f in sent}
        limit = 2 * self.cfg.controller_timeout + 1.0
        deadline = time.monotonic() + limit
        acked: dict | None = None
        while pending and acked is None:
            done, pending = wait(pending, timeout=max(0.0, deadline - time.monotonic()), return_when=FIRST_COMPLETED)
            if not done:
                break
            for f in done:
                if f.exception() is None and f.result()[0] == 200:
                    acked = f.result()[1]
        if acked is None:
            with self._lock:
                self._registered.discard(plan.key)
            whys = [self._why(lane, f) for lane, f in sent if f.done()]
            whys += [f"{lane.url}: no answer within {limit:.0f} s" for lane, f in sent if not f.done()]
            return self._failed(plan.job_id, "; ".join(whys))
        log.info("job %s registered with the controller: cookie %s, %s flows on %s switches (%s ms)", plan.job_id,
                 acked.get("cookie"), acked.get("flows_per_switch"), acked.get("switches"), acked.get("ms"))
        return acked

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
        with self._lock:
            self._registered.discard(key)
        sent = self._fan_out("DELETE", f"/v1/jobs/{quote(key, safe='')}")
        wait([f for _, f in sent], timeout=self.cfg.controller_timeout + 1.0)
        for lane, f in sent:
            if not f.done():
                log.warning("controller %s has not yet removed job %s (it will, in order)", lane.url, job_id)
            elif f.exception() is not None or f.result()[0] != 200:
                log.warning("could not remove job %s from the controller (the next resync will): %s", job_id,
                            self._why(lane, f))

    def jobs(self) -> list[dict]:
        out = []
        for rec in self.records.all():
            live = rec.phase == "ready" or (rec.phase == "setting-up" and rec.key in self._registered)
            traits = self.traits(rec.plan.get("network_type", ""))
            if live and traits is not None and traits.bridged and (rec.plan.get("ipv4") or rec.plan.get("ipv6")):
                out.append(registration(rec.plan, JobNames(rec.key, self.cfg.netns_prefix).job_mac,
                                        traits.tags_labels))
        return out

    def sync(self) -> bool:
        """Send this EP's full list of jobs to every controller; each drops every other job it holds for this EP.
        True when all took it."""
        sent = [lane.submit(lane.sync) for lane in self.lanes]
        done, _ = wait(sent, timeout=max(60.0, self.cfg.controller_timeout))
        return len(done) == len(sent) and all(f.exception() is None and f.result() for f in done)

    def poll(self) -> None:
        """One health poll of every controller (each in its own turn; a poll still under way is not repeated)."""
        for lane in self.lanes:
            if not lane.polling:
                lane.polling = True
                lane.submit(lane.health)

    def start(self) -> None:
        """Resync at once (larkd has just started), then every controller_resync seconds, and poll each controller's
        health every HEALTH_INTERVAL seconds (a restarted controller is resynced at once)."""
        if self.enabled:
            threading.Thread(target=self._loop, name="lark-controller-sync", daemon=True).start()

    def _loop(self) -> None:
        next_sync = 0.0
        while True:
            if time.monotonic() >= next_sync:
                self.sync()
                next_sync = time.monotonic() + self.cfg.controller_resync
            else:
                self.poll()
            if self._stop.wait(min(HEALTH_INTERVAL, self.cfg.controller_resync)):
                return

    def stop(self) -> None:
        self._stop.set()
