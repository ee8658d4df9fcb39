"""Where larkd's setup of one NAT job goes: each step of JobNetworker.setup, timed by wrapping the kernel-layer
functions and objects it calls (nothing in lark/ changes for this), over BENCH_N sequential jobs.

Runs like bench/setup_latency.py: in a private "host" netns it makes (with an uplink `up0`), each job a process in
an empty netns (`unshare -n`), the same JobNetworker code larkd runs. The first 5 jobs are warm-up and not
counted. Prints a table (step, p50 and mean ms per job; steps nest only where said), then one key=value line.
`--repo DIR` profiles another checkout's lark/ (e.g. a `git archive` of an older commit) with the same wrapping.
"""
from __future__ import annotations

import argparse
import collections
import functools
import importlib
import logging
import os
import secrets
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import runfs  # bench/runfs.py (this script's directory is on sys.path)

N = int(os.environ.get("BENCH_N", "40"))
WARMUP = 5
log = logging.getLogger("setup_profile")


def pct50(xs: list[float]) -> float:
    return statistics.median(xs) if xs else 0.0


class Steps:
    """Per-job milliseconds of each wrapped callable (summed when a job calls it more than once)."""

    def __init__(self) -> None:
        self.job: dict[str, float] = {}
        self.all: dict[str, list[float]] = collections.defaultdict(list)
        self.nested: set[str] = set()   # rows within another row: not added to the steps' sum

    def wrap(self, obj: Any, name: str, label: str, nested: bool = False) -> None:
        f = getattr(obj, name, None)
        if f is None:  # not in this checkout's code: no row
            log.info("no %s.%s here; not profiled", getattr(obj, "__name__", type(obj).__name__), name)
            return

        @functools.wraps(f)
        def timed(*a: Any, **k: Any) -> Any:
            t = time.perf_counter()
            try:
                return f(*a, **k)
            finally:
                self.job[label] = self.job.get(label, 0.0) + (time.perf_counter() - t) * 1000

        setattr(obj, name, timed)
        if nested:
            self.nested.add(label)

    def end_job(self, keep: bool) -> None:
        if keep:
            for k, v in self.job.items():
                self.all[k].append(v)
        self.job = {}


def inner(repo: str, limit_mbit: float) -> None:
    sys.path.insert(0, repo)
    st = Steps()
    # Wrapped before lark.kernel.ops (and the attach modes) import them: KernelOps's fields are the functions
    # as they were when ops.py was imported, so a wrap after that import would time nothing.
    for modname, name, nested in (("netns", "attach", False), ("netns", "netlink_in", False),
                                  ("mtu", "for_job", False), ("links", "create_veth", False),
                                  ("links", "bring_up_job_side", False), ("links", "add_job_address", False),
                                  ("dns", "setup_job", False), ("shaping", "apply", False),
                                  ("shaping", "_htb", True), ("firewall.job_netns", "secure", False),
                                  ("scitags", "secure", False)):
        try:  # an older checkout may lack a module: no row for it
            mod = importlib.import_module(f"lark.kernel.{modname}")
        except ImportError:
            log.info("no lark.kernel.%s here; not profiled", modname)
            continue
        st.wrap(mod, name, f"{modname.rsplit('.', 1)[-1]}.{name}" + (" (nested)" if nested else ""), nested)
    # The pyroute2 IPRoute JobNetlink makes in the job's netns on first use (what it costs to make, not its uses;
    # within whichever step first asks it something)
    st.wrap(importlib.import_module("lark.kernel.netns"), "IPRoute", "IPRoute made in the job's netns (nested)",
            nested=True)
    from lark.config import Config
    from lark.daemon.jobnet import JobNetworker
    from lark.daemon.records import FinishedStore, RecordStore
    from lark.kernel import ipam, netns
    from lark.kernel.accounting import Accountant
    from lark.kernel.firewall import make_firewall
    from lark.plan import NetworkPlan

    st.wrap(ipam.LockPool, "reserve", "ipam reserve (address)")
    tmp = runfs.tmpfs_dir("lark-profile-")  # larkd's run_dir on tmpfs, as on an EP (bench/runfs.py)
    cfg = Config(run_dir=f"{tmp}/run", state_dir=f"{tmp}/state", netns_prefix=f"lark-p{secrets.token_hex(2)}-",
                 uplink="up0", subnet="10.214.0.0/22").validate()
    fw = make_firewall(cfg)
    fw.ensure_base()
    netns.ensure_netns_dir(cfg.netns_dir)
    net = JobNetworker(cfg, fw, RecordStore(cfg.records_dir), Accountant(fw), FinishedStore(f"{tmp}/state/finished"))
    st.wrap(net.records, "save", "record saves")
    st.wrap(net.fw, "add_job", "nft: the job's host rules (fw.add_job)")
    st.wrap(net.acct, "start", "accounting start")
    st.wrap(net.controller, "register", "controller registration")
    st.wrap(net, "check_feasible", "feasibility check")
    # Each resource's whole add (the engine's steps): the rows above nest within these; not in the steps' sum.
    for r in getattr(getattr(net, "engine", None), "resources", ()):
        st.wrap(r, "add", f"resource {r.name} (whole step)", nested=True)
    for m in net.modes.values():
        for meth in ("ensure_prepared", "attach", "wait_forwarding", "secure"):
            st.wrap(m, meth, f"mode.{meth}")
    procs = [subprocess.Popen(["unshare", "--net", "sleep", "600"]) for _ in range(N + WARMUP)]
    totals: list[float] = []
    try:
        me = os.stat("/proc/self/ns/net").st_ino
        for p in procs:
            while os.stat(f"/proc/{p.pid}/ns/net").st_ino == me:
                time.sleep(0.001)
        for i, p in enumerate(procs):
            plan = NetworkPlan(job_id=f"{i}.0", slot=f"b{i}", key=f"b{i}", network_type="nat", address_type="static",
                               rate_limit_mbit=limit_mbit or None)
            t = time.perf_counter()
            net.setup(plan, os.getpid(), 0, p.pid, netns.netns_inode_of_pid(p.pid))
            if i >= WARMUP:
                totals.append((time.perf_counter() - t) * 1000)
            st.end_job(i >= WARMUP)
            net.teardown(f"b{i}", "profile")
    finally:
        for p in procs:
            p.kill()
            p.wait()
        fw.destroy_base()
        subprocess.run(["rm", "-rf", tmp])
    rows = sorted(st.all.items(), key=lambda kv: -pct50(kv[1]))
    steps_p50 = sum(pct50(v) for k, v in rows if k not in st.nested)
    shape = f"limited to {limit_mbit:g} Mbit/s each way" if limit_mbit else "no limit"
    print(f"larkd setup of a NAT job ({shape}), {len(totals)} jobs (after {WARMUP} warm-up), lark/ of {repo}")
    print("(rows marked nested are within another row, e.g. shaping._htb (both ends) within shaping.apply; those "
          "marked whole step hold others; neither is in the steps' sum)")
    print(f"{'step':<50} {'p50 ms':>7} {'mean ms':>8}")
    for k, v in rows:
        print(f"{k:<50} {pct50(v):>7.2f} {statistics.mean(v):>8.2f}")
    rest = pct50(totals) - steps_p50
    print(f"{'rest (Python between the steps, closing sockets)':<50} {rest:>7.2f}")
    print(f"{'setup total (JobNetworker.setup)':<50} {pct50(totals):>7.2f} {statistics.mean(totals):>8.2f}")
    print()
    rows_top = [(k, v) for k, v in rows if k not in st.nested]
    top = rows_top[0][0].split(" (")[0].replace(" ", "_").replace(":", "") if rows_top else "-"
    print(f"setup_p50_ms={pct50(totals):.2f} steps_p50_sum_ms={steps_p50:.2f} top_step={top} "
          f"top_step_p50_ms={pct50(rows_top[0][1]) if rows_top else 0:.2f}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repo", default=str(Path(__file__).resolve().parent.parent))
    ap.add_argument("--limit-mbit", type=float, default=0.0,
                    help="each job's rate limit both ways, as a slot's Bandwidth gives it (bench/e2e_latency.py's "
                         "jobs: 100); 0: none")
    ap.add_argument("--inner", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    if args.inner:
        inner(args.repo, args.limit_mbit)
        return 0
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from setup_latency import in_private_host  # the same private host netns
    return in_private_host([sys.executable, __file__, "--inner", "--repo", args.repo,
                            "--limit-mbit", str(args.limit_mbit)], "lark-profile-host")

if __name__ == "__main__":
    sys.exit(main())
