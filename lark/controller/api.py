"""The registration API: HTTPS with mutual TLS (stdlib http.server + ssl). The client certificate's common name
is the EP's identity: an EP registers, removes and resyncs only its own jobs, within its [ep.NAME] section, and
sees only its own jobs; names in `admin_names` (and the controller's own certificate: `lark-controller status`) may
act for any EP and see everything. Nobody without a certificate from the controller's CA gets past the TLS
handshake, and nobody on the network can hold the API's threads: handshakes run without blocking in one thread,
each with a deadline, at most `max_handshakes` at once; only authenticated connections reach the bounded worker
pool, at most MAX_CONNECTIONS_PER_EP of them per EP (issue 26).

The certificate's role (its OU, lark.controller.certs) decides what it may ask: only an EP's (`lark-ep`) registers,
removes and resyncs jobs; the controller's own (`lark-controller`) reads the status; a switch's (`lark-switch`), or
one without a role, is refused every request (403): the CA signs all three, so the common name alone would let a
stolen switch key register jobs."""
from __future__ import annotations

import contextlib
import json
import logging
import queue
import selectors
import socket
import ssl
import threading
import time
import weakref
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any
from urllib.parse import unquote

from ..errors import LarkError
from . import certs
from .config import ControllerConfig
from .metrics import ControllerMetrics
from .model import JobReg, Refused

log = logging.getLogger("lark.controller.api")
MAX_BODY = 4 << 20               # a resync of 4096 jobs is about 2 MiB
MAX_CONNECTIONS_PER_EP = 4       # larkd makes one request at a time; more from one EP is a client holding workers
REQUEST_TIMEOUT = 10.0           # per receive of an authenticated client's request
MAX_HEADER_LINE = 65536          # as http.client: a longer request or header line is refused
MAX_HEADERS = 100


def server_context(cfg: ControllerConfig) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        ctx.load_cert_chain(cfg.cert, cfg.key)
        ctx.load_verify_locations(cfg.ca)
    except (OSError, ssl.SSLError) as e:
        raise LarkError(f"cannot load TLS files: {e}", obj=f"controller cert {cfg.cert} / key {cfg.key} / CA {cfg.ca}",
                        fix="make them with `lark-controller certs --dir DIR controller=<address> ep1 ep2`") from None
    ctx.verify_mode = ssl.CERT_REQUIRED     # mutual TLS: no client certificate, no connection
    return ctx


def cert_name(path: str) -> str:
    """The common name of a PEM certificate file (the controller's own: the name its CLI connects with)."""
    from cryptography import x509
    from cryptography.x509.oid import NameOID
    with open(path, "rb") as f:
        names = x509.load_pem_x509_certificate(f.read()).subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    return str(names[0].value) if names else ""


def _subject(sock: ssl.SSLSocket, key: str) -> list[str]:
    cert: dict[str, Any] = sock.getpeercert() or {}  # its values' shapes differ by key
    return [v for rdn in cert.get("subject", ()) for k, v in rdn if k == key]


def peer_name(sock: ssl.SSLSocket) -> str:
    names = _subject(sock, "commonName")
    return names[0] if names else ""


def peer_role(sock: ssl.SSLSocket) -> str:
    """The client certificate's role, as certs.role_of reads it: its one OU, "" when it has none or several."""
    units = _subject(sock, "organizationalUnitName")
    return units[0] if len(units) == 1 else ""


def refusal(name: str, role: str, write: bool) -> Refused | None:
    """Why a client with this certificate may not make this request (None: it may). `write`: a registration,
    removal or resync."""
    if role == certs.ROLE_EP or (role == certs.ROLE_CONTROLLER and not write):
        return None
    fix = (f"register jobs with the EP's own certificate (OU {certs.ROLE_EP}), made by `lark-controller certs --dir "
           f"DIR <ep name>`") if write else (f"use an EP's certificate (OU {certs.ROLE_EP}) or the controller's "
                                              "(`lark-controller status` on its host)")
    what = "registers, removes and resyncs jobs only for EP certificates" if write else "serves EPs and the controller"
    return Refused(f"certificate CN={name or '?'} has role {role or 'none'!r}: the registration API {what}",
                   obj=f"request from {name or '?'}", fix=fix)


class Headers:
    """A request's header fields by lower-case name: what the handler reads of them (get, get_all). http.server
    hands them to the email package's parser, which was 15% of a registration's CPU in the controller under the
    capacity bench (docs/controller.md "Capacity"); these requests have three or four plain fields."""
    __slots__ = ("_fields",)

    def __init__(self, fields: dict[str, list[str]]):
        self._fields = fields

    def get(self, name: str, default: str | None = None) -> str | None:
        values = self._fields.get(name.lower())
        return values[0] if values else default

    def get_all(self, name: str, failobj: list[str] | None = None) -> list[str] | None:
        return list(self._fields.get(name.lower(), ())) or failobj


class Handler(BaseHTTPRequestHandler):
    server: ApiServer
    raw_requestline: bytes   # set by http.server's handle_one_request
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True   # headers and body go out as two writes: no 40 ms delayed-ACK stall between them

    def log_message(self, fmt: str, *args) -> None:
        if log.isEnabledFor(logging.DEBUG):
            log.debug("%s %s", self.client_address[0], fmt % args)

    def parse_request(self) -> bool:
        """The request line as http.server reads it (HTTP/1.0 and 1.1 only), the header fields into Headers: one
        `Name: value` per line (no folded lines), at most MAX_HEADERS lines of at most MAX_HEADER_LINE bytes."""
        self.command = None   # type: ignore[assignment]   # as http.server: set in case of an error on the first line
        self.request_version = "HTTP/1.1"   # no HTTP/0.9 here: an error about the request line has a status line too
        self.close_connection = True
        self.requestline = str(self.raw_requestline, "iso-8859-1").rstrip("\r\n")
        words = self.requestline.split()
        if not words:
            return False
        if len(words) != 3 or words[2] not in ("HTTP/1.0", "HTTP/1.1"):
            self.send_error(400 if len(words) != 3 or not words[2].startswith("HTTP/") else 505,
                            f"Bad request line ({self.requestline[:200]!r}): METHOD PATH HTTP/1.1 expected")
            return False
        self.command, self.path, self.request_version = words
        self.close_connection = self.request_version != "HTTP/1.1"
        if self.path.startswith("//"):
            self.path = "/" + self.path.lstrip("/")   # as http.server (gh-87389)
        fields: dict[str, list[str]] = {}
        for _ in range(MAX_HEADERS + 1):
            line = self.rfile.readline(MAX_HEADER_LINE + 1)
            if len(line) > MAX_HEADER_LINE:
                self.send_error(431, "Line too long")
                return False
            if line in (b"\r\n", b"\n", b""):
                break
            name, colon, value = str(line, "iso-8859-1").partition(":")
            if not colon or not name or name != name.strip() or line[:1] in (b" ", b"\t"):
                self.send_error(400, f"Bad header line {line[:200]!r}: Name: value expected")
                return False
            fields.setdefault(name.lower(), []).append(value.strip(" \t\r\n"))
        else:
            self.send_error(431, f"Too many headers (more than {MAX_HEADERS})")
            return False
        self.headers = Headers(fields)   # type: ignore[assignment]   # what the handler reads: get, get_all
        conntype = (self.headers.get("Connection") or "").lower()
        if conntype == "close":
            self.close_connection = True
        elif conntype == "keep-alive":
            self.close_connection = False
        if (self.headers.get("Expect") or "").lower() == "100-continue" and self.request_version == "HTTP/1.1":
            return bool(self.handle_expect_100())
        return True

    def _reply(self, code: int, body: dict) -> None:
        """The answer in one write (one TLS record, not one for the header and one for the body)."""
        data = json.dumps(body).encode()
        self.log_request(code)
        head = (f"{self.protocol_version} {code} {self.responses.get(code, ('',))[0]}\r\n"
                f"Server: {self.version_string()}\r\nDate: {self.date_time_string()}\r\n"
                "Content-Type: application/json\r\n"
                f"Content-Length: {len(data)}\r\n"
                f"X-Lark-Boot: {self.server.controller.boot}\r\n\r\n")   # HA: a new one tells the EP to resync
        self.wfile.write(head.encode("latin-1") + data)

    def _peer(self) -> tuple[str, str]:
        """The client certificate's (common name, role), read once per connection."""
        return self.server.peer(self.connection)

    def _body(self) -> object:
        where = f"{self.command} {self.path} from {self._peer()[0]}"
        keep, self.close_connection = self.close_connection, True   # a body not read to its end ends the connection
        given = self.headers.get_all("Content-Length") or ["0"]
        if len(set(given)) != 1 or not (given[0].isascii() and given[0].isdigit()):   # no sign, space, "1e3", "²"
            raise LarkError(f"Content-Length {', '.join(given)!r} is not one length in bytes", obj=where,
                            fix="send one Content-Length header with the body's size")
        n = int(given[0])
        if n > MAX_BODY:
            raise LarkError(f"request body of {n} bytes is too large (at most {MAX_BODY})", obj=where,
                            fix="resync fewer jobs at once")
        try:
            data = self.rfile.read(n)
        except TimeoutError:
            raise LarkError(f"the body did not arrive within {REQUEST_TIMEOUT:.0f} s", obj=where,
                            fix="send as many bytes as Content-Length says") from None
        if len(data) != n:
            raise LarkError(f"the body ended after {len(data)} of {n} bytes", obj=where)
        self.close_connection = keep
        try:
            return json.loads(data or b"{}")
        except (ValueError, RecursionError) as e:
            raise LarkError(f"body is not JSON: {e}", obj=where, fix="send one JSON object") from None

    def _ep(self, body: object) -> str:
        """The EP a request that changes jobs acts for: the certificate's name, which must have the EP role (a
        switch's or the controller's certificate registers nothing); an admin EP may name another EP."""
        name, role = self._peer()
        refused = refusal(name, role, write=True)
        if refused is not None:
            self.close_connection = True    # its body, if any, stays unread
            raise refused
        if self.server.is_admin(name, role) and isinstance(body, dict) and body.get("ep"):
            return str(body["ep"])
        return name

    def _run(self, fn) -> None:
        t0 = time.perf_counter()
        try:
            code, body = fn()
        except Refused as e:     # valid, but not this EP's to ask (or over its quota)
            log.warning("refused %s from %s: %s", self.command, self._peer()[0], e)
            code, body = e.status, {"error": str(e)}
        except LarkError as e:
            log.error("%s from %s: %s", self.command, self._peer()[0], e)
            code, body = 400, {"error": str(e)}
        except Exception as e:  # the API must answer, whatever failed
            log.exception("%s %s failed", self.command, self.path)
            code, body = 500, {"error": f"controller error: {e}"}
        seconds = time.perf_counter() - t0
        body["ms"] = round(seconds * 1000, 3)
        self._reply(code, body)
        if self.server.metrics is not None:
            self.server.metrics.observe(self.command, code, seconds)

    def handle(self) -> None:
        # One request per turn in a worker: a kept-alive connection (larkd keeps one) waits for its next request in
        # the server's selector thread (ApiServer._serve), not in a worker. No client of this API pipelines.
        self.close_connection = True
        self.handle_one_request()

    def _status(self) -> tuple[int, dict]:
        name, role = self._peer()
        refused = refusal(name, role, write=False)
        if refused is not None:
            raise refused
        if not self.server.is_admin(name, role):
            return 200, self.server.controller.status(name)
        return 200, {**self.server.controller.status(), "api": self.server.load()}

    def do_GET(self) -> None:
        if self.path == "/v1/status":
            self._run(self._status)
        elif self.path == "/v1/health":    # the EPs' health poll (HA model, docs/controller.md)
            self._run(lambda: (200, self.server.controller.health()))
        else:
            self._reply(404, {"error": f"no such resource {self.path}"})

    def do_POST(self) -> None:
        if self.path != "/v1/jobs":
            return self._reply(404, {"error": f"no such resource {self.path}"})

        def register():
            self._ep({})    # the certificate's role before the body is read
            body = self._body()
            job = JobReg.from_wire(body, self._ep(body))
            return self.server.controller.register(job)
        self._run(register)

    def do_DELETE(self) -> None:
        parts = self.path.split("/")
        if len(parts) != 4 or parts[:3] != ["", "v1", "jobs"]:
            return self._reply(404, {"error": f"no such resource {self.path}"})
        self._run(lambda: self.server.controller.unregister(self._ep({}), unquote(parts[3])))

    def do_PUT(self) -> None:
        if self.path != "/v1/sync":
            return self._reply(404, {"error": f"no such resource {self.path}"})

        def sync():
            self._ep({})
            body = self._body()
            ep = self._ep(body)
            jobs = body.get("jobs") if isinstance(body, dict) else None
            if not isinstance(jobs, list):
                raise LarkError("a resync must carry {\"jobs\": [...]}", obj=f"resync from {ep}")
            return self.server.controller.sync(ep, [JobReg.from_wire(j, ep) for j in jobs])
        self._run(sync)


class Waits:
    """Connections waiting for their peer, all in one thread that never blocks on one: new connections until their
    TLS handshake is done (each within `handshake_timeout`, at most `limit` at once: one more drops the oldest), and
    authenticated kept-alive ones until their next request (each within REQUEST_TIMEOUT). A peer that sends nothing
    or stalls mid-handshake costs a file descriptor until its deadline, never a thread. A connection whose peer is
    ready goes to `ready(sock, addr, name)` (name "" after a handshake); an idle one that expires to `gone(name)`."""

    def __init__(self, handshake_timeout: float, limit: int, ready, gone):
        self.handshake_timeout, self.limit, self.ready, self.gone = handshake_timeout, limit, ready, gone
        self.sel = selectors.DefaultSelector()
        # socket -> (address, deadline, EP name); insertion order is deadline order (one timeout per kind)
        self.handshaking: dict[ssl.SSLSocket, tuple[Any, float, str]] = {}
        self.idle: dict[ssl.SSLSocket, tuple[Any, float, str]] = {}
        self.inbox: queue.SimpleQueue[tuple[ssl.SSLSocket, Any, str]] = queue.SimpleQueue()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self.sel.register(self._wake_r, selectors.EVENT_READ)
        self.closed = False
        self.dropped = Counter[str]()   # why handshakes ended unfinished: "timeout", "evicted", "failed"

    def add(self, sock: ssl.SSLSocket, addr, name: str = "") -> None:
        """A new connection (name "": handshake first) or an authenticated one between requests."""
        self.inbox.put((sock, addr, name))
        with contextlib.suppress(OSError):   # BlockingIOError: woken already (buffer full); or closing
            self._wake_w.send(b"x")

    def close(self) -> None:
        self.closed = True
        with contextlib.suppress(OSError):
            self._wake_w.send(b"x")

    def run(self) -> None:
        while not self.closed:
            try:
                self._turn()
            except Exception:   # one bad socket must not end the API
                log.exception("registration API: connection loop")
        for sock in [*self.handshaking, *self.idle]:
            self._end(sock, "", "")
        self.sel.close()
        self._wake_r.close()
        self._wake_w.close()

    def _turn(self) -> None:
        deadlines = [w[1] for w in (next(iter(d.values()), None) for d in (self.handshaking, self.idle)) if w]
        timeout = max(0.0, min(deadlines) - time.monotonic()) if deadlines else None
        for key, _ in self.sel.select(timeout):
            sock = key.fileobj
            if sock is self._wake_r:
                with contextlib.suppress(BlockingIOError):
                    while self._wake_r.recv(4096):
                        pass
            elif sock in self.handshaking:
                self._handshake(sock)
            elif sock in self.idle:
                addr, _, name = self.idle.pop(sock)
                self.sel.unregister(sock)
                self.ready(sock, addr, name)
        self._take_new()
        now = time.monotonic()
        for waiting, why in ((self.handshaking, f"no TLS handshake within {self.handshake_timeout} s"),
                             (self.idle, "")):
            while waiting:   # oldest first; not a copy of all 1,000 idle connections every turn (issue 26 capacity)
                sock, (_, deadline, _) = next(iter(waiting.items()))
                if deadline > now:
                    break
                self._end(sock, "timeout", why)

    def _take_new(self) -> None:
        while True:
            try:
                sock, addr, name = self.inbox.get_nowait()
            except queue.Empty:
                return
            if name:
                self.idle[sock] = (addr, time.monotonic() + REQUEST_TIMEOUT, name)
            else:
                if len(self.handshaking) >= self.limit:
                    self._end(next(iter(self.handshaking)), "evicted", f"more than {self.limit} handshakes at once")
                self.handshaking[sock] = (addr, time.monotonic() + self.handshake_timeout, "")
            self.sel.register(sock, selectors.EVENT_READ)

    def _handshake(self, sock: ssl.SSLSocket) -> None:
        try:
            sock.do_handshake()
        except ssl.SSLWantReadError:
            self.sel.modify(sock, selectors.EVENT_READ)
        except ssl.SSLWantWriteError:
            self.sel.modify(sock, selectors.EVENT_WRITE)
        except (ssl.SSLError, OSError) as e:
            self._end(sock, "failed", str(e))
        else:
            addr, _, _ = self.handshaking.pop(sock)
            self.sel.unregister(sock)
            sock.setblocking(True)
            self.ready(sock, addr, "")

    def _end(self, sock: ssl.SSLSocket, reason: str, why: str) -> None:
        """Close a waiting connection: an unfinished handshake (counted, logged) or an idle one (its EP's turn)."""
        addr, _, name = (self.handshaking if sock in self.handshaking else self.idle).pop(sock)
        self.sel.unregister(sock)
        if name:
            self.gone(name)
        elif reason:
            self.dropped[reason] += 1
            log.log(logging.WARNING if reason == "failed" else logging.INFO,
                    "refused a TLS connection from %s: %s", addr[0] if addr else "?", why)
        with contextlib.suppress(OSError):
            sock.close()


class ApiServer(HTTPServer):
    request_queue_size = 128    # the listen backlog: a burst of connections must not make a real EP's SYN wait

    def __init__(self, cfg: ControllerConfig, controller, metrics: ControllerMetrics | None = None):
        self.cfg = cfg
        self.controller = controller
        self.metrics = metrics
        self.ctx = server_context(cfg)
        self.admins = set(cfg.admin_names)
        self.controller_name = cert_name(cfg.cert)
        self.waits = Waits(cfg.handshake_timeout, cfg.max_handshakes, self._ready, self._release)
        self.workers = ThreadPoolExecutor(cfg.workers, thread_name_prefix="lark-api-worker")
        # connections per EP name past their handshake (in a worker, queued for one, or idle between requests)
        self._connections: Counter[str] = Counter()
        # each authenticated connection's (common name, role): getpeercert() decodes the certificate on every call,
        # and a request asked it 4-6 times
        self._peers: weakref.WeakKeyDictionary[ssl.SSLSocket, tuple[str, str]] = weakref.WeakKeyDictionary()
        self._serving = 0
        self._lock = threading.Lock()
        super().__init__((cfg.api_host, cfg.api_port), Handler)

    def is_admin(self, name: str, role: str) -> bool:
        """Sees every job; an admin EP may also act for another EP. An EP certificate that merely has the
        controller's name is not the controller."""
        if role == certs.ROLE_CONTROLLER:
            return name == self.controller_name or name in self.admins
        return role == certs.ROLE_EP and bool(name) and name in self.admins

    def peer(self, sock: ssl.SSLSocket) -> tuple[str, str]:
        """The client certificate's (common name, role) on this connection."""
        got = self._peers.get(sock)
        if got is None:
            got = self._peers[sock] = (peer_name(sock), peer_role(sock))
        return got

    def load(self) -> dict:
        """The API's own figures, for admins' status."""
        with self._lock:
            serving, conns = self._serving, sum(self._connections.values())
        return {"workers": self.cfg.workers, "serving": serving, "connections": conns,
                "handshaking": len(self.waits.handshaking), "idle": len(self.waits.idle),
                "handshakes_dropped": dict(self.waits.dropped)}

    def get_request(self):
        sock, addr = self.socket.accept()
        sock.setblocking(False)
        return self.ctx.wrap_socket(sock, server_side=True, do_handshake_on_connect=False), addr

    def process_request(self, request, client_address) -> None:
        self.waits.add(request, client_address)   # the connection loop owns it now

    def _ready(self, sock: ssl.SSLSocket, addr, name: str) -> None:
        if not name:    # just authenticated
            name = self.peer(sock)[0]
            with self._lock:
                busy = self._connections[name] >= MAX_CONNECTIONS_PER_EP
                if not busy:
                    self._connections[name] += 1
            if busy:
                log.warning("refused a connection from %s (%s): it has %d connections open already", name,
                            addr[0], MAX_CONNECTIONS_PER_EP)
                self.shutdown_request(sock)
                return
            sock.settimeout(REQUEST_TIMEOUT)
        try:
            self.workers.submit(self._serve, sock, addr, name)
        except RuntimeError:   # shutting down
            self.shutdown_request(sock)
            self._release(name)

    def _serve(self, sock: ssl.SSLSocket, addr, name: str) -> None:
        keep = False
        with self._lock:
            self._serving += 1
        try:
            keep = not Handler(sock, addr, self).close_connection
        except Exception:
            self.handle_error(sock, addr)
        finally:
            with self._lock:
                self._serving -= 1
        if keep and sock.pending():
            self._ready(sock, addr, name)      # its next request is here already
        elif keep:
            self.waits.add(sock, addr, name)   # wait for it without a thread
        else:
            self.shutdown_request(sock)
            self._release(name)

    def _release(self, name: str) -> None:
        with self._lock:
            self._connections[name] -= 1

    def start(self) -> threading.Thread:
        threading.Thread(target=self.waits.run, name="lark-api-waits", daemon=True).start()
        t = threading.Thread(target=self.serve_forever, name="lark-api", daemon=True)
        t.start()
        return t

    def server_close(self) -> None:
        self.waits.close()
        self.workers.shutdown(wait=False, cancel_futures=True)
        super().server_close()
