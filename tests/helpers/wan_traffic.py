"""Paced UDP and iperf3 TCP uploads from job namespaces to the WAN host (WAN group tests and bench/wan_groups.py)."""
import json
import subprocess
import sys
import time

from helpers.sdn import WAN_SERVER, SdnPool, sh

UDP_SENDER = """
import socket, sys, time
dst, mbit, seconds = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
payload, t0, sent = b"x" * 1200, time.time(), 0
while (now := time.time()) < t0 + seconds:
    if sent * 8 < mbit * 1e6 * (now - t0):     # paced: the offered load, not as fast as Python can go
        s.sendto(payload, (dst, 9))
        sent += len(payload)
    else:
        time.sleep(0.0005)
"""


def udp_upload(pool: SdnPool, names: list[str], mbit: float, seconds: float) -> None:
    """Each job offers `mbit` of UDP to the WAN host at once (no control channel: a meter drops freely)."""
    senders = [subprocess.Popen(["ip", "netns", "exec", pool.jobs[n]["ns"], sys.executable, "-c", UDP_SENDER,
                                 WAN_SERVER, str(mbit), str(seconds)]) for n in names]
    pool.procs.extend(senders)
    for p in senders:
        assert p.wait(seconds + 30) == 0


def tcp_upload(pool: SdnPool, names: list[str], seconds: float, base_port: int = 5401) -> list[float]:
    """Goodput in Mbit/s of each job's concurrent iperf3 TCP upload (one stream each), as the receiver saw it."""
    servers = [subprocess.Popen(["ip", "netns", "exec", pool.wan, "iperf3", "-s", "-1", "-p", str(base_port + i)],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for i in range(len(names))]
    pool.procs.extend(servers)
    time.sleep(0.5)
    clients = [subprocess.Popen(["ip", "netns", "exec", pool.jobs[n]["ns"], "iperf3", "-c", WAN_SERVER, "-p",
                                 str(base_port + i), "-t", str(seconds), "-J"], stdout=subprocess.PIPE, text=True)
               for i, n in enumerate(names)]
    pool.procs.extend(clients)
    out = []
    for c in clients:
        data = json.loads(c.communicate(timeout=seconds + 60)[0])
        out.append(data["end"]["sum_received"]["bits_per_second"] / 1e6)
    return out


def wan_rx_bytes(pool: SdnPool, dev: str = "w0") -> int:
    """Bytes the WAN router received on one of its links (w0 behind wan0, w1 behind wan1)."""
    return json.loads(sh(["ip", "-n", pool.wan, "-j", "-s", "link", "show", dev]).stdout)[0]["stats64"]["rx"]["bytes"]
