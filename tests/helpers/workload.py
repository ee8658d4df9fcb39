"""Workloads a test job runs (as an unprivileged user, inside its own network namespace)."""
import json
import os
import socket
import sys
import time
import urllib.request


def resolve(name: str, server: str, proto: str) -> dict:
    """One A query, by hand (the job side has the standard library only); the first address answered."""
    import struct
    query = struct.pack(">HHHHHH", 0x4c4b, 0x0100, 1, 0, 0, 0) + b"".join(
        bytes([len(p)]) + p.encode() for p in name.split(".")) + b"\0" + struct.pack(">HH", 1, 1)
    try:
        if proto == "tcp":
            with socket.create_connection((server, 53), timeout=3) as s:
                s.sendall(struct.pack(">H", len(query)) + query)
                size = struct.unpack(">H", s.recv(2))[0]
                reply = b""
                while len(reply) < size:
                    reply += s.recv(size - len(reply))
        else:
            with socket.socket(socket.AF_INET6 if ":" in server else socket.AF_INET, socket.SOCK_DGRAM) as s:
                s.settimeout(3)
                s.sendto(query, (server, 53))
                reply = s.recvfrom(4096)[0]
    except OSError as e:
        return {"error": str(e)}
    answers = struct.unpack(">H", reply[6:8])[0]
    return {"address": socket.inet_ntoa(reply[-4:]) if answers else None, "answers": answers}


def udp_size(host: str, port: int, size: int, dont_fragment: bool) -> dict:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        if dont_fragment:
            s.setsockopt(socket.IPPROTO_IP, 10, 2)  # IP_MTU_DISCOVER = IP_PMTUDISC_DO
        s.settimeout(3)
        try:
            s.sendto(b"m" * size, (host, port))
            return {"echoed": int(s.recvfrom(100)[0])}
        except OSError as e:
            return {"error": str(e)}


def upload_to_sink(host: str, port: int, size: int, timeout: float) -> tuple[int, int]:
    """Send size bytes to the world's byte sink; (bytes sent, bytes the sink says it received)."""
    with socket.create_connection((host, port), timeout=timeout) as s:
        buf, sent = b"x" * 65536, 0
        while sent < size:
            sent += s.send(buf[: min(len(buf), size - sent)])
        s.shutdown(socket.SHUT_WR)
        return sent, int(s.recv(100).decode().strip() or 0)


def main():
    cmd, args = sys.argv[1], sys.argv[2:]
    if cmd == "download":
        with urllib.request.urlopen(args[0], timeout=20) as r:
            n = 0
            while True:
                chunk = r.read(1 << 16)
                if not chunk:
                    break
                n += len(chunk)
        print(json.dumps({"downloaded": n}))
    elif cmd == "download-for":
        end, n, rounds = time.time() + float(args[1]), 0, 0
        while time.time() < end:
            with urllib.request.urlopen(args[0], timeout=20) as r:
                n += len(r.read())
            rounds += 1
        print(json.dumps({"downloaded": n, "rounds": rounds}))
    elif cmd == "download-rate":  # url warmup seconds: payload Mbit/s after the warmup, downloading in a loop
        start = time.time() + float(args[1])
        end, n = start + float(args[2]), 0
        while time.time() < end:
            with urllib.request.urlopen(args[0], timeout=20) as r:
                while time.time() < end:
                    chunk = r.read(1 << 16)
                    if not chunk:
                        break
                    if time.time() >= start:
                        n += len(chunk)
        print(json.dumps({"mbit": n * 8 / 1e6 / float(args[2])}))
    elif cmd == "upload":
        size = int(args[2])
        with socket.create_connection((args[0], int(args[1])), timeout=10) as s:
            buf = b"x" * 65536
            sent = 0
            while sent < size:
                sent += s.send(buf[: min(len(buf), size - sent)])
            s.shutdown(socket.SHUT_WR)
            reply = s.recv(100).decode().strip()
        print(json.dumps({"uploaded": sent, "server_counted": int(reply)}))
    elif cmd == "whoami":
        with socket.create_connection((args[0], int(args[1])), timeout=5) as s:
            print(json.dumps({"seen_as": s.recv(100).decode().strip()}))
    elif cmd == "connect":
        try:
            socket.create_connection((args[0], int(args[1])), timeout=float(args[2]) if len(args) > 2 else 2).close()
            print(json.dumps({"connected": True}))
        except OSError as e:
            print(json.dumps({"connected": False, "error": str(e)}))
    elif cmd == "listen":
        port = int(os.environ.get("LARK_INBOUND_PORT", args[0] if args else "9000"))
        srv = socket.create_server(("0.0.0.0", port))
        srv.settimeout(float(args[1]) if len(args) > 1 else 10)
        print(json.dumps({"listening": port}), flush=True)
        try:
            c, _ = srv.accept()
            c.sendall(b"hello from job\n")
            c.close()
        except socket.timeout:
            pass
    elif cmd == "timed-download-upload":
        t0 = time.time()
        with urllib.request.urlopen(args[0], timeout=60) as r:
            got = len(r.read())
        t1 = time.time()
        sent, _ = upload_to_sink(args[1], int(args[2]), int(args[3]), 60)
        print(json.dumps({"downloaded": got, "down_s": t1 - t0, "uploaded": sent, "up_s": time.time() - t1}))
    elif cmd == "await-transfer":  # gofile url host port size: idle until gofile exists, then down- and upload
        print(json.dumps({"ready": True}), flush=True)
        while not os.path.exists(args[0]):
            time.sleep(0.2)
        with urllib.request.urlopen(args[1], timeout=120) as r:
            got = len(r.read())
        sent, counted = upload_to_sink(args[2], int(args[3]), int(args[4]), 120)
        print(json.dumps({"downloaded": got, "uploaded": sent, "server_counted": counted}))
    elif cmd == "iperf3":  # host port seconds down|up: goodput seen by the receiver, bit/s
        import subprocess
        argv = ["iperf3", "-c", args[0], "-p", args[1], "-t", args[2], "-O", "1", "-J"]
        if args[3] == "down":
            argv.append("-R")
        cp = subprocess.run(argv, capture_output=True, text=True, timeout=float(args[2]) + 30)
        report = json.loads(cp.stdout) if cp.stdout.strip().startswith("{") else {}
        print(json.dumps({"bps": report.get("end", {}).get("sum_received", {}).get("bits_per_second"),
                          "error": report.get("error") or cp.stderr[-300:]}))
    elif cmd == "run":
        import subprocess
        env = dict(os.environ, PATH="/usr/sbin:/sbin:/usr/bin:/bin")
        cp = subprocess.run(args, capture_output=True, text=True, env=env)
        print(json.dumps({"rc": cp.returncode, "stderr": cp.stderr[-300:]}))
    elif cmd == "env":
        print(json.dumps({k: v for k, v in os.environ.items() if k.startswith("LARK_")}))
    elif cmd == "links":
        print(json.dumps(sorted(n for _, n in socket.if_nameindex())))
    elif cmd == "download-then-sleep":  # url seconds: say what was moved, then stay alive to be observed
        with urllib.request.urlopen(args[0], timeout=20) as r:
            n = len(r.read())
        print(json.dumps({"downloaded": n}), flush=True)
        time.sleep(float(args[1]))
    elif cmd == "download-then-await":  # url path: say what was moved, then stay alive until the test creates path
        with urllib.request.urlopen(args[0], timeout=20) as r:
            n = len(r.read())
        print(json.dumps({"downloaded": n}), flush=True)
        deadline = time.time() + 300    # a test that died must not leave the job behind for long
        while not os.path.exists(args[1]) and time.time() < deadline:
            time.sleep(0.1)
    elif cmd == "resolve":  # name nameserver [udp|tcp]: what a stub resolver does with resolv.conf's nameserver
        print(json.dumps(resolve(args[0], args[1], args[2] if len(args) > 2 else "udp")))
    elif cmd == "udp-size":  # host port size [df]: send one datagram, the echo server answers with its length
        print(json.dumps(udp_size(args[0], int(args[1]), int(args[2]), len(args) > 3 and args[3] == "df")))
    elif cmd == "mtu":  # the MTU of a device of the job's netns (sysfs shows the host's namespace)
        import fcntl
        import struct
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            got = fcntl.ioctl(s, 0x8921, struct.pack("16si", args[0].encode(), 0))  # SIOCGIFMTU
        print(json.dumps({"mtu": struct.unpack("16si", got)[1]}))
    elif cmd == "sleep":
        time.sleep(float(args[0]))
        print(json.dumps({"slept": float(args[0])}))
    else:
        sys.exit(f"unknown workload {cmd}")


if __name__ == "__main__":
    main()
