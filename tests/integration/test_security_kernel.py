"""Security hardening on the real kernel (issue 14, kernel side): each test is an attack or a starvation attempt.

Jobs run unprivileged in namespaces the fake execution point makes; spoofed frames come from a privileged helper
inside the job's namespace (the strongest attacker), and the test captures what reaches the other side.
"""
from __future__ import annotations

import json
import os
import time

import pytest

from helpers.fakehost import WORLD_IP, sh
from helpers.waits import wait_ready
from lark.kernel import netns, shaping

MB = 1_000_000


def job_rates_mbit(host, job: dict) -> tuple[float | None, float | None]:
    """The job's HTB rate on the host side and inside its netns (Mbit/s), read back from the kernel."""
    out = []
    for path, dev in ((f"/run/netns/{host.host_ns}", job["host_if"]), (f"/run/netns/{job['netns']}", "eth0")):
        fd = os.open(path, os.O_RDONLY)
        try:
            with netns.netlink_in(fd) as ipr:
                rate = shaping.read_rate(ipr, ipr.link_lookup(ifname=dev)[0])
        finally:
            os.close(fd)
        out.append(rate / 1e6 if rate else None)
    return out[0], out[1]


def test_unreserved_jobs_cannot_starve_a_reservation(host):
    """A 400 Mbit/s link (tbf on the world side); one job reserved 300, three without a reservation saturate
    the link. Before: the three ran unlimited and TCP split the link four ways (~100 each)."""
    link, reserved = 400, 300
    sh(["ip", "netns", "exec", host.world_ns, "tc", "qdisc", "replace", "dev", "w0", "root", "tbf",
        "rate", f"{link}mbit", "burst", "256kb", "latency", "50ms"])
    (host.www / "20M.bin").write_bytes(b"\0" * (20 * MB))
    url = f"http://{WORLD_IP}:8000/20M.bin"
    hogs = []
    for i in (2, 3, 4):
        ad = f"ClusterId = 14{i}\nProcId = 0"
        host.publish_ad(f"slot{i}", ad, f"Bandwidth = 0\nTotalBandwidth = {link}")
        hogs.append(host.spawn_job(f"slot{i}", ["download-for", url, "16"], job_ad=ad))
    jobs = [wait_ready(host, f"slot{i}") for i in (2, 3, 4)]
    time.sleep(0.5)
    ad = "ClusterId = 141\nProcId = 0"
    host.publish_ad("slot1", ad, f"Bandwidth = {reserved}\nTotalBandwidth = {link}")
    p = host.spawn_job("slot1", ["download-rate", url, "1.5", "5"], job_ad=ad)
    mine = wait_ready(host, "slot1")
    # The unreserved jobs share what the reservation leaves, at both ends of their veths.
    share = (link - reserved) / 3
    for j in jobs:
        assert job_rates_mbit(host, j) == pytest.approx((share, share), rel=1e-3), host.larkd_log()
    assert job_rates_mbit(host, mine) == (reserved, reserved)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 0, err + host.larkd_log()
    got = json.loads(out)["mbit"]
    for h in hogs:  # they were saturating the link all along (their share, not less)
        hout, herr = h.communicate(timeout=60)
        assert h.returncode == 0, herr
        assert json.loads(hout)["downloaded"] * 8 / 1e6 / 16 >= share * 0.5, hout
    assert got >= 0.95 * reserved, f"reserved job got {got:.1f} Mbit/s of {reserved}"


def test_fair_share_follows_jobs_coming_and_going(host):
    """Shares are recomputed when a reserved job starts and ends: the sum of limits never exceeds the link."""
    link = 100
    for i, bw in ((1, 0), (2, 0), (3, 60)):
        host.publish_ad(f"slot{i}", f"ClusterId = 15{i}\nProcId = 0", f"Bandwidth = {bw}\nTotalBandwidth = {link}")
    a = host.spawn_job("slot1", ["sleep", "20"], job_ad="ClusterId = 151\nProcId = 0")
    ja = wait_ready(host, "slot1")
    assert job_rates_mbit(host, ja) == (link, link)          # alone: the whole link
    b = host.spawn_job("slot2", ["sleep", "20"], job_ad="ClusterId = 152\nProcId = 0")
    jb = wait_ready(host, "slot2")
    assert job_rates_mbit(host, ja) == job_rates_mbit(host, jb) == (link / 2, link / 2)
    r = host.spawn_job("slot3", ["sleep", "1"], job_ad="ClusterId = 153\nProcId = 0")
    wait_ready(host, "slot3")
    assert job_rates_mbit(host, ja) == job_rates_mbit(host, jb) == (20, 20)   # (100 - 60) / 2
    r.communicate(timeout=30)
    deadline = time.time() + 10
    while job_rates_mbit(host, ja) != (link / 2, link / 2) and time.time() < deadline:
        time.sleep(0.1)
    assert job_rates_mbit(host, ja) == job_rates_mbit(host, jb) == (link / 2, link / 2)
    for p in (a, b):
        p.kill()
        p.wait(10)
