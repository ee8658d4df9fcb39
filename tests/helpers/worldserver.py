"""Test servers for the "world" namespace: HTTP files (8000, GET, and PUT under /up/), who-am-I (7000), byte sink
(7001)."""
import functools
import http.server
import os
import socketserver
import sys
import threading
import time


class WhoAmI(socketserver.BaseRequestHandler):
    def handle(self):
        self.request.sendall(f"{self.client_address[0]}\n".encode())


class Sink(socketserver.BaseRequestHandler):
    def handle(self):
        total = 0
        while True:
            data = self.request.recv(1 << 16)
            if not data:
                break
            total += len(data)
        try:
            self.request.sendall(f"{total}\n".encode())
        except OSError:
            pass


class Files(http.server.SimpleHTTPRequestHandler):
    """GET serves the directory; PUT stores under up/ (HTCondor's curl plugin uploads output_destination so)."""

    def timed(self, method: str, nbytes: int, started: float) -> None:
        """One line per transfer, for tests that time goodput at this end (not by anything of Lark's)."""
        sys.stderr.write(f"transfer {method} {self.path} {self.client_address[0]} {nbytes} "
                         f"{time.monotonic() - started:.4f}\n")
        sys.stderr.flush()

    def do_GET(self):
        started = time.monotonic()
        super().do_GET()
        path = self.translate_path(self.path)
        if os.path.isfile(path):
            self.timed("GET", os.path.getsize(path), started)

    def do_PUT(self):
        started = time.monotonic()
        received = 0
        rel = self.path.split("?", 1)[0].lstrip("/")
        parts = [p for p in rel.split("/") if p not in ("", ".", "..")]
        if len(parts) < 2 or parts[0] != "up":
            self.send_error(403, "uploads go under /up/")
            return
        dest = os.path.join(self.directory, *parts)
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        length = int(self.headers.get("Content-Length") or 0)
        with open(dest + ".part", "wb") as f:
            if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                while (size := int(self.rfile.readline().split(b";")[0], 16)):
                    f.write(self.rfile.read(size))
                    received += size
                    self.rfile.readline()
                self.rfile.readline()
            else:
                while length > 0:
                    chunk = self.rfile.read(min(length, 1 << 16))
                    if not chunk:
                        break
                    f.write(chunk)
                    length -= len(chunk)
                    received += len(chunk)
        os.replace(dest + ".part", dest)
        self.timed("PUT", received, started)
        self.send_response(201)
        self.send_header("Content-Length", "0")
        self.end_headers()


class TCP(socketserver.ThreadingTCPServer):
    allow_reuse_address = True
    daemon_threads = True


def main():
    root = sys.argv[1]
    servers = [
        http.server.ThreadingHTTPServer(("0.0.0.0", 8000),
                                        functools.partial(Files, directory=root)),
        TCP(("0.0.0.0", 7000), WhoAmI),
        TCP(("0.0.0.0", 7001), Sink),
    ]
    for s in servers:
        threading.Thread(target=s.serve_forever, daemon=True).start()
    print("ready", flush=True)
    threading.Event().wait()


if __name__ == "__main__":
    # Quiet by default (the fake host reads only "ready" from its pipes); the testbed logs every request to a
    # file, with the client's address, so tests can see which address a job used.
    if "--log-requests" in sys.argv:
        sys.argv.remove("--log-requests")
    else:
        Files.log_message = lambda *a: None
        Files.timed = lambda *a: None
    main()
