"""Test servers for the "world" namespace: HTTP files (8000), who-am-I (7000), byte sink (7001)."""
import functools
import http.server
import socketserver
import sys
import threading


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


class TCP(socketserver.ThreadingTCPServer):
    allow_reuse_address = True
    daemon_threads = True


def main():
    root = sys.argv[1]
    servers = [
        http.server.ThreadingHTTPServer(("0.0.0.0", 8000),
                                        functools.partial(http.server.SimpleHTTPRequestHandler, directory=root)),
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
        http.server.SimpleHTTPRequestHandler.log_message = lambda *a: None
    main()
