#!/usr/bin/env python3
"""HA figures (issue 26, docs/controller.md "HA model"): two real lark-controllers on one private Open vSwitch
(userspace datapath, OpenFlow over TLS), and larkd's own client (lark.daemon.controller_client) with both URLs and
an EP of JOBS running jobs (its records stubbed; the periodic resync set to an hour, so only the immediate resync
can restore a restarted controller).

Per round: controller 0 is killed with -9 and at once a new job is registered through the client (time from the
kill to its flows acknowledged: "served again"); controller 0 is started again and the time from its API's first
answer to all JOBS + 1 jobs registered there is taken ("whole"). Prints a table, then one key=value line.
Run as root: `.venv/bin/python bench/controller_ha.py [ROUNDS]`."""
from __future__ import annotations

import logging
import os
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
from helpers.sdn_ha import HaPool  # noqa: E402

from lark.config import Config  # noqa: E402
from lark.daemon.controller_client import ControllerClient  # noqa: E402
from lark.kernel import netns as nsutil  # noqa: E402
from lark.names import JobNames  # noqa: E402
from lark.plan import Addresses, JobNetwork, NetworkPlan  # noqa: E402

JOBS = 200
log = logging.getLogger("bench.controller_ha")


@dataclass
class Rec:
    """What the client's resync reads of a larkd record."""
    key: str
    plan: dict = field(default_factory=dict)
    phase: str = "ready"


class Records:
    def __init__(self) -> None:
        self.recs: list[Rec] = []

    def all(self) -> list[Rec]:
        return list(self.recs)

    def add(self, i: int) -> JobNetwork:
        ip = f"10.79.{i // 250}.{i % 250 + 1}"
        plan = NetworkPlan(job_id=f"{200000 + i}.0", slot=f"slot{i}", key=f"ha{i}", network_type="bridge",
                           owner=f"user{i % 20}")
        net = JobNetwork(plan, Addresses(ipv4=ip))
        self.recs.append(Rec(net.key, net.to_dict()))
        return net


def whole_after(pool: HaPool, i: int, n: int) -> float:
    answered = pool.wait_ready(i)
    while time.time() - answered < 60:
        if pool.status(i)["totals"]["jobs"] >= n:
            break
        time.sleep(0.02)
    return time.time() - answered


def main() -> int:
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    tmp = tempfile.mkdtemp(prefix="lark-bench-ha-")
    pool = HaPool(tmp, policies='[[policy]]\nname = "slices"\nkind = "slice"\nselect = \'true\'\n',
                  reconcile_grace=30.0)
    served, whole = [], []
    try:
        pool.start()
        cfg = Config(controller_url=pool.urls, controller_ca=str(pool.tls / "ca.pem"),
                     controller_cert=str(pool.tls / "ep1.pem"), controller_key=str(pool.tls / "ep1.key"),
                     controller_timeout=2.0, controller_resync=3600.0).validate()
        records = Records()
        for i in range(JOBS):
            records.add(i)
        client = ControllerClient(cfg, records)   # type: ignore[arg-type]   (the stub has what the client reads)
        fd = os.open(f"/run/netns/{pool.core}", os.O_RDONLY)
        try:
            with nsutil.entered(fd):   # the controllers listen on the core netns' loopback; the client's threads
                client.start()         # are made here, so they are in it too
                for i in (0, 1):
                    whole_after(pool, i, JOBS)
                for r in range(rounds):
                    pool.kill(0)
                    t0 = time.perf_counter()
                    net = records.add(JOBS + r)
                    client.register(net, JobNames(net.key, cfg.netns_prefix).job_mac)   # raises unless acked
                    served.append(time.perf_counter() - t0)
                    pool.start_controller(0)
                    whole.append(whole_after(pool, 0, JOBS + r + 1))
                client.stop()
        finally:
            os.close(fd)
    finally:
        pool.close()
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"lark-controller HA bench: 2 controllers, 1 OVS (userspace datapath), {JOBS} jobs on the EP, {rounds} "
          "rounds of kill -9; shared 2-vCPU machine")
    print(f"{'measure':<64} {'median':>8} {'max':>8}  unit")
    rows = [("kill -9 of controller 0 -> next job's flows acknowledged", [s * 1000 for s in served], "ms"),
            ("controller 0 restarted: API first answer -> every job registered", whole, "s")]
    for name, xs, unit in rows:
        print(f"{name:<64} {statistics.median(xs):>8.2f} {max(xs):>8.2f}  {unit}")
    print(f"jobs={JOBS + rounds} rounds={rounds} served_again_max_ms={max(served) * 1000:.1f} "
          f"whole_after_restart_max_s={max(whole):.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
