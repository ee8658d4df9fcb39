"""A local user flooding larkd's socket: holds up to N connections open (sending nothing) and reopens every one
larkd closes, for S seconds or until SIGTERM. usage: flooder.py SOCKET N SECONDS; prints how many connections it
opened."""
import json
import selectors
import signal
import socket
import sys
import time


def main() -> None:
    path, want, seconds = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
    sel = selectors.DefaultSelector()
    opened = refused = 0
    end = time.time() + seconds
    stop: list[int] = []
    signal.signal(signal.SIGTERM, lambda signum, frame: stop.append(signum))
    print("flooding", flush=True)
    while time.time() < end and not stop:
        while len(sel.get_map()) < want:
            s = socket.socket(socket.AF_UNIX)
            try:
                s.connect(path)
            except OSError:
                s.close()
                refused += 1
                break
            s.setblocking(False)
            sel.register(s, selectors.EVENT_READ)
            opened += 1
        for key, _ in sel.select(timeout=0.05):
            try:
                data = key.fileobj.recv(4096)
            except OSError:
                data = b""
            if not data or data.endswith(b"\n"):  # closed, or answered "busy": open another one
                sel.unregister(key.fileobj)
                key.fileobj.close()
    print(json.dumps({"opened": opened, "connect_failed": refused}), flush=True)


if __name__ == "__main__":
    main()
