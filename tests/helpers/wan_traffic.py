"""Paced UDP upload from job namespaces to the WAN host (WAN group tests and bench/wan_groups.py)."""
import subprocess
import sys

from helpers.sdn import WAN_SERVER, SdnPool

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
