"""The registration API: HTTPS with mutual TLS (stdlib http.server + ssl). The client certificate's common name
is the EP's identity: an EP registers, removes and resyncs only its own jobs; names in `admin_names` may act for
any EP. Nobody without a certificate from the controller's CA gets past the TLS handshake."""
from __future__ import annotations

import json
import logging
import ssl
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import unquote

from ..errors import LarkError
from .config import ControllerConfig
from .metrics import ControllerMetrics
from .model import JobReg

log = logging.getLogger("lark.controller.api")
MAX_BODY = 4 << 20


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


def peer_name(sock: ssl.SSLSocket) -> str:
    cert: dict[str, Any] = sock.getpeercert() or {}  # its values' shapes differ by key
    for rdn in cert.get("subject", ()):
        for k, v in rdn:
            if k == "commonName":
                return v
    return ""


class Handler(BaseHTTPRequestHandler):
    server: ApiServer
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True   # headers and body go out as two writes: no 40 ms delayed-ACK stall between them

    def log_message(self, fmt: str, *args) -> None:
        log.debug("%s %s", self.client_address[0], fmt % args)

    def _reply(self, code: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _body(self) -> object:
        n = int(self.headers.get("Content-Length") or 0)
        if n > MAX_BODY:
            raise LarkError(f"request body of {n} bytes is too large", obj="registration API")
        try:
            return json.loads(self.rfile.read(n) or b"{}")
        except ValueError as e:
            raise LarkError(f"body is not JSON: {e}", obj="registration API") from None

    def _ep(self, body: object) -> str:
        """The EP a request acts for: the certificate's name; an admin may name another EP."""
        name = peer_name(self.connection)
        if name in self.server.cfg.admin_names and isinstance(body, dict) and body.get("ep"):
            return str(body["ep"])
        return name

    def _run(self, fn) -> None:
        t0 = time.perf_counter()
        try:
            code, body = fn()
        except LarkError as e:
            log.error("%s from %s: %s", self.command, peer_name(self.connection), e)
            code, body = 400, {"error": str(e)}
        except Exception as e:  # the API must answer, whatever failed
            log.exception("%s %s failed", self.command, self.path)
            code, body = 500, {"error": f"controller error: {e}"}
        seconds = time.perf_counter() - t0
        body["ms"] = round(seconds * 1000, 3)
        self._reply(code, body)
        if self.server.metrics is not None:
            self.server.metrics.observe(self.command, code, seconds)

    def do_GET(self) -> None:
        if self.path == "/v1/status":
            self._run(lambda: (200, self.server.controller.status()))
        else:
            self._reply(404, {"error": f"no such resource {self.path}"})

    def do_POST(self) -> None:
        if self.path != "/v1/jobs":
            return self._reply(404, {"error": f"no such resource {self.path}"})

        def register():
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
            body = self._body()
            ep = self._ep(body)
            jobs = body.get("jobs") if isinstance(body, dict) else None
            if not isinstance(jobs, list):
                raise LarkError("a resync must carry {\"jobs\": [...]}", obj=f"resync from {ep}")
            return self.server.controller.sync(ep, [JobReg.from_wire(j, ep) for j in jobs])
        self._run(sync)


class ApiServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, cfg: ControllerConfig, controller, metrics: ControllerMetrics | None = None):
        self.cfg = cfg
        self.controller = controller
        self.metrics = metrics
        self.ctx = server_context(cfg)
        super().__init__((cfg.api_host, cfg.api_port), Handler)

    def get_request(self):
        sock, addr = self.socket.accept()
        sock.settimeout(10)  # a silent peer must not hold a thread forever
        return self.ctx.wrap_socket(sock, server_side=True, do_handshake_on_connect=False), addr

    def finish_request(self, request, client_address) -> None:
        try:
            request.do_handshake()
        except (ssl.SSLError, OSError) as e:
            log.warning("refused a TLS connection from %s: %s", client_address[0], e)
            return
        super().finish_request(request, client_address)

    def start(self) -> threading.Thread:
        t = threading.Thread(target=self.serve_forever, name="lark-api", daemon=True)
        t.start()
        return t
