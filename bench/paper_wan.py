#!/usr/bin/env python3
"""The paper's WAN experiments (section VII-A.2 Fig. 10, VII-C Fig. 12 / Table III) on the pool testbed, with real
HTCondor jobs uploading through the core switch to a WAN sink (issue 12, "Figures").

Setup (testbed/pool.py, started here and stopped at the end, also on failure):
- The WAN link is emulated at 1 Gbit/s on the WAN namespace's side of the wan0 link: everything arriving on w0 is
  redirected to an ifb shaped to 1 Gbit/s (link_commands). By default (`--link fair`) the link splits evenly among
  the sources using it (an htb class per job address), i.e. the even split the paper expects from TCP fairness
  without management; `--link fifo` is a plain drop-tail tbf, where TCP uploads here (sub-millisecond RTT, no
  netem in this kernel to add WAN delay) lock each other out instead of sharing. The sink (this file, `--sink`,
  in the WAN namespace) accepts any number of uploads on WAN_SERVER:SINK_PORT and records every 0.5 s the bytes
  received per source address (the iperf3 servers serve one client at a time).
- TCP: the uploads use Reno (`--cc`). This kernel's default is BBR (CONFIG_DEFAULT_TCP_CONG), which is not
  loss-based; the paper's Linux hosts ran loss-based TCP (CUBIC), whose fairness its "without management" runs
  show. CUBIC is not in tcp_allowed_congestion_control here, so a job (unprivileged) cannot pick it; Reno it can.
- The controller has only [[wan_group]] sections (no drop/slice/steer policies): "cms" selects
  `AcctGroup =?= "cms"` (submit files say `accounting_group = cms`, `accounting_group_user = alice`), "other"
  is the catch-all (`select = 'true'`). `--mechanism` is written as `[wan] mechanism`: queue (the default here, as
  in the paper: shaping, htb queues on the core's WAN port, which the controller makes through the switch's OVSDB
  and classifies with tc, this switch being a userspace datapath) or meter (the controller's OpenFlow 1.3 meters,
  policing). Management off = the same controller restarted with no [[wan_group]] at all: at the switch's
  reconnect it deletes Lark's meters or queues (and the flows that name them), so the jobs' uploads are switched
  by NORMAL and meet only the 1 Gbit/s link.
- The EPs must not be the bottleneck: the pool's larkd normally gives unreserved jobs a fair share of the EP's
  1000 Mbit/s (default_bandwidth "fair") and static slots split the Bandwidth resource among them. Here the EPs
  have no Bandwidth resource (MACHINE_RESOURCE_INVENTORY_Bandwidth empty) and LARK_DEFAULT_BANDWIDTH =
  unlimited, so larkd puts no limit on any job; only the core switch and the WAN link do. 9 static slots per EP
  (17 jobs), and LARK_CONTROLLER_RESYNC = 5 s so that jobs are re-registered within seconds of a controller restart.

Jobs: 17 uploaders are submitted once and run through every round: cms-a and cms-b (alice, accounting group
cms), other-1..other-15 (bob and carol, no accounting group). Each writes its address, then waits for the driver's
round files: a round names the jobs that send, a common start time (a barrier: all uploads start together) and a
duration. A sending job opens one TCP connection to the sink and sends for the round's duration, then reports.
The jobs use file transfer, as on a pool without a shared filesystem (uploader.py is sent, python3 is the EP's):
the round files and reports are in each job's scratch directory on its EP (pool.job_scratch), and come back to the
submit directory when the job ends. A job that started more than once or was evicted (its event log, read once the
jobs have left the queue) would have joined rounds twice or missed some: the bench then prints no figures, exit 1.
Fixed duration rather than the paper's fixed size (5 GB, 1 GB): a 1 GB upload at 1000/16 Mbit/s takes over two
minutes, so 30 runs of fixed-size uploads cannot fit a CI-length run, and with a fixed duration every job competes
for the whole measured window (the competition is the same from the first to the last second), which gives stable
averages. Goodput is measured at the sink over the round's window minus the first WARMUP seconds (TCP start and
the meters' 25%-of-rate burst allowance) and the last second. For a fixed-size upload under constant competition,
time without / time with = goodput with / goodput without, which is the speed-up printed next to Table III.
- Fig. 10: cms 250 Mbit/s, other 100 Mbit/s; cms-a, cms-b, other-1, other-2 upload at once. Goals: each group's
  aggregate goodput within +-5% of its rate; the two jobs of a group within +-15% of each other (min/max >= 0.85).
- Fig. 12 / Table III: cms 900, other 100; cms-a and other-1..N upload at once, with and without management, for
  N in 1,2,4,8,15 (--full: 1..15). Goal: the cms job's goodput with management within +-5% of 900 for every N.
Goodput is TCP payload. A queue's htb counts whole frames (per segment, also of a TSO packet), so a group exactly
at its rate shows 0.956 x rate of goodput (1448 payload bytes per 1514-byte frame): the +-5% goals leave queues
half a percent. The userspace datapath's meters count the unsegmented 64 KB TSO packets, i.e. about the payload:
a metered group gets ~0.99 x rate of goodput and 1.04 x rate of frames, so at Fig. 12 the other group takes
~104 Mbit/s of the 1000 Mbit/s link and the cms job gets what is left, 0.949-0.955 of 900 in three runs.

Prints the tables, writes bench/out/paper_wan_fig10.png and bench/out/paper_wan_fig12.png, and the last line is
  cms_ratio_min=<x> cms_ratio_max=<y> groups_within_5pct=<k>/<n>
(cms job goodput / 900 over the managed Fig. 12 runs; k of n group aggregates of all managed runs within +-5% of
their rates). Run as root, holding the testbed lock: `flock /tmp/lark-testbed.lock .venv/bin/python
bench/paper_wan.py` (make bench-wan does).
"""
from __future__ import annotations

import argparse
import json
import logging
import math
import os
import re
import selectors
import signal
import socket
import subprocess
import sys
import time
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
OUT = HERE / "out"
sys.path.insert(0, str(REPO / "testbed"))
import eventlog  # noqa: E402 (testbed/, standard library only)

log = logging.getLogger("paper-wan")

LINK_MBIT = 1000
SINK_PORT = 9000
INTERVAL = 0.5                       # sink sample period (s)
WARMUP = 4.0                         # seconds of each round left out of the averages (slow start, meter burst)
TAIL = 1.0
FIG10_RATES = {"cms": 250, "other": 100}
FIG12_RATES = {"cms": 900, "other": 100}
DEFAULT_NS = [1, 2, 4, 8, 15]
MAX_OTHERS = 15
PAPER_TABLE3 = [1.8, 2.7, 3.6, 5.7, 6.5, 7.6, 7.9, 10.6, 11.2, 12.9, 13.5, 17.6, 22.1, 22.7, 25.2]
GOAL_RATE = 0.05                     # group aggregate / cms job goodput within +-5% of the rate
GOAL_SPLIT = 0.85                    # the two jobs of a group within +-15% of each other: min/max >= 0.85
SLOTS_PER_EP = 9
MIN_GOODPUT = 1.0                    # Mbit/s: below this a round's job is reported as not having uploaded


# -- pure parts (tests/unit/test_paper_wan.py) ------------------------------------------------------------------
def wan_policies(rates: dict[str, float] | None, mechanism: str | None = "meter", ovsdb: str = "",
                 tc_netns: str = "") -> str:
    """The controller's policy sections: none (management off), or the cms group and the catch-all, with
    `[wan] mechanism` unless `mechanism` is None (a controller that predates the key: meters). Queues need the
    core switch's OVSDB and, the controller running in the CM's namespace, the WAN ports' namespace for tc."""
    queue = (f'ovsdb = "{ovsdb}"\ntc_netns = "{tc_netns}"\n' if mechanism == "queue" else "")
    if not rates:
        # Management off. Queues (unlike meters) are the switch's OVSDB rows and tc classes: a controller that
        # still runs the queue mechanism, with no group, is what removes Lark's at its next switch connect.
        return f'\n[wan]\nmechanism = "queue"\n{queue}' if mechanism == "queue" else ""
    return (f'\n[[wan_group]]\nname = "cms"\nselect = \'AcctGroup =?= "cms"\'\nrate_mbit = {rates["cms"]}\n'
            f'\n[[wan_group]]\nname = "other"\nselect = \'true\'\nrate_mbit = {rates["other"]}\n'
            '\n[wan]\nunmatched = "pass"\n' + (f'mechanism = "{mechanism}"\n' if mechanism else "") + queue)


def queue_place(pool) -> dict[str, str]:
    """Where the queue mechanism finds the core switch: its private OVSDB, and the core's namespace for tc."""
    return {"ovsdb": f"unix:{pool.OVS_DIR}/db.sock", "tc_netns": f"{pool.PREFIX}core"}


def rate_between(samples: list[tuple[float, dict]], addr: str, t0: float, t1: float) -> float:
    """Mbit/s received from `addr` between the first sample at or after t0 and the last at or before t1."""
    inside = [(t, b.get(addr, 0)) for t, b in samples if t0 <= t <= t1]
    if len(inside) < 2 or inside[-1][0] <= inside[0][0]:
        return float("nan")
    (ta, ba), (tb, bb) = inside[0], inside[-1]
    return (bb - ba) * 8 / (tb - ta) / 1e6


def series(samples: list[tuple[float, dict]], addrs: list[str], t_ref: float, t_end: float,
           step: float = 1.0) -> list[tuple[float, float]]:
    """(seconds since t_ref, Mbit/s of the sum over `addrs` during the preceding `step`) from cumulative samples."""
    pts = [(t, sum(b.get(a, 0) for a in addrs)) for t, b in samples if t_ref - step <= t <= t_end + step]
    out, j = [], 0
    for i, (t, n) in enumerate(pts):
        while pts[j][0] < t - step - 1e-6:
            j += 1
        if j < i and t >= t_ref and pts[i][0] - pts[j][0] > step / 2:
            out.append((t - t_ref, (n - pts[j][1]) * 8 / (t - pts[j][0]) / 1e6))
    return out


def socket_drops(ss_output: str) -> int:
    """Packets the kernel dropped at the packet sockets `ss -0 -m -a -n` lists (its skmem `d` counters): in the
    core namespace, the userspace datapath's per-port receive sockets, which overflow when its thread falls behind
    (the job's TCP then loses a 64 KB TSO packet at once)."""
    return sum(int(m) for m in re.findall(r"skmem:\([^)]*\bd(\d+)\)", ss_output))


def within(value: float, target: float, tol: float = GOAL_RATE) -> bool:
    return not math.isnan(value) and abs(value / target - 1) <= tol


def split(a: float, b: float) -> float:
    """min/max of two jobs' goodputs: 1.0 = an even split."""
    if math.isnan(a) or math.isnan(b) or max(a, b) <= 0:
        return float("nan")
    return min(a, b) / max(a, b)


@dataclass
class Fig10:
    rates: dict[str, float]
    jobs: dict[str, float]           # label -> goodput Mbit/s
    groups: dict[str, list[str]]     # group -> its two job labels
    offered: dict[str, float] = field(default_factory=dict)   # group -> its meter's or queue's bytes, Mbit/s

    def total(self, group: str) -> float:
        return sum(self.jobs[j] for j in self.groups[group])

    def ratio(self, group: str) -> float:
        return self.total(group) / self.rates[group]

    def split(self, group: str) -> float:
        a, b = (self.jobs[j] for j in self.groups[group])
        return split(a, b)

    def rate_ok(self, group: str) -> bool:
        return within(self.total(group), self.rates[group])

    def split_ok(self, group: str) -> bool:
        s = self.split(group)
        return not math.isnan(s) and s >= GOAL_SPLIT


@dataclass
class Fig12Row:
    n: int
    cms_with: float
    cms_without: float
    others_with: float               # sum over the N other jobs
    others_without: float
    others_min_with: float = float("nan")
    others_max_with: float = float("nan")
    switch_drops_with: int | None = None  # packets the core's packet sockets dropped during the managed round

    @property
    def cms_ratio(self) -> float:
        return self.cms_with / FIG12_RATES["cms"]

    @property
    def speedup(self) -> float:
        """Time of a fixed-size upload without management / with it = goodput with / goodput without; not a number
        when the job moved (next to) nothing without management (its upload would not finish: no finite ratio)."""
        return self.cms_with / self.cms_without if self.cms_without >= MIN_GOODPUT else float("nan")

    @property
    def paper(self) -> float | None:
        return PAPER_TABLE3[self.n - 1] if 1 <= self.n <= len(PAPER_TABLE3) else None


def _fmt(v: float, spec: str) -> str:
    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else format(v, spec)


def _grid(rows: list[list[str]], left: int = 1) -> str:
    """Columns before `left` and the last one (the goal) flush left, the numbers flush right."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    last = len(widths) - 1
    return "\n".join("  ".join(c.ljust(w) if i < left or i == last else c.rjust(w)
                               for i, (c, w) in enumerate(zip(r, widths))).rstrip() for r in rows)


def fig10_table(f: Fig10) -> str:
    rows = [["group", "rate", "job", "goodput Mbit/s", "sum/rate", "min/max", "switch counter Mbit/s (round)", "goal"]]
    for g, labels in f.groups.items():
        for j in labels:
            rows.append([g, f"{f.rates[g]:g}", j, _fmt(f.jobs[j], ".1f"), "", "", "", ""])
        goal = ("met" if f.rate_ok(g) and f.split_ok(g) else
                "NOT met (" + ", ".join(x for x, ok in (("rate", f.rate_ok(g)), ("split", f.split_ok(g))) if not ok)
                + ")")
        rows.append([g, f"{f.rates[g]:g}", "sum", _fmt(f.total(g), ".1f"), _fmt(f.ratio(g), ".3f"),
                     _fmt(f.split(g), ".2f"), _fmt(f.offered.get(g, float("nan")), ".1f"), goal])
    return _grid(rows, left=3)


def fig12_table(rows: list[Fig12Row]) -> str:
    out = [["N", "cms with", "cms/900", "others with (sum)", "other job min-max", "switch drops", "cms without",
            "others without (sum)", "speed-up", "paper", "goal"]]
    for r in rows:
        out.append([str(r.n), _fmt(r.cms_with, ".1f"), _fmt(r.cms_ratio, ".3f"), _fmt(r.others_with, ".1f"),
                    f"{_fmt(r.others_min_with, '.1f')}-{_fmt(r.others_max_with, '.1f')}",
                    "-" if r.switch_drops_with is None else str(r.switch_drops_with),
                    _fmt(r.cms_without, ".1f"), _fmt(r.others_without, ".1f"), _fmt(r.speedup, ".1f"),
                    _fmt(r.paper, ".1f") if r.paper is not None else "-",
                    "met" if within(r.cms_with, FIG12_RATES["cms"]) else "NOT met"])
    return _grid(out, left=0)


def summary(fig10: Fig10 | None, rows: list[Fig12Row]) -> str:
    """The last line: the cms job's goodput/900 over the managed Fig. 12 runs, and how many group aggregates of
    all managed runs (Fig. 10: cms and other; Fig. 12: cms and the N others, per N) are within +-5% of their rate."""
    checks: list[bool] = []
    if fig10 is not None:
        checks += [fig10.rate_ok(g) for g in fig10.groups]
    for r in rows:
        checks += [within(r.cms_with, FIG12_RATES["cms"]), within(r.others_with, FIG12_RATES["other"])]
    ratios = [r.cms_ratio for r in rows if not math.isnan(r.cms_ratio)]
    lo = f"{min(ratios):.3f}" if ratios else "nan"
    hi = f"{max(ratios):.3f}" if ratios else "nan"
    return f"cms_ratio_min={lo} cms_ratio_max={hi} groups_within_5pct={sum(checks)}/{len(checks)}"


def link_commands(kind: str, sources: list[str], dev: str = "w0", ifb: str = "ifbw0") -> list[list[str]]:
    """`ip`/`tc` commands (without the netns) for the emulated WAN link: everything arriving on `dev` from the core
    switch goes through `ifb`, shaped to LINK_MBIT.
      fifo  a tbf: one drop-tail queue of 20 ms, as a plain router port.
      fair  an htb whose leaves are one class per source address (equal guaranteed rates, all may borrow up to
            the link, drop-tail 512 KB each) and one for anything else: the link is split evenly among the sources
            that use it, as fair queueing does and as TCP fairness aims to.
    Why `fair` is the default: this kernel has no netem (no propagation delay) and no sfq/fq_codel, and over a
    drop-tail FIFO with the namespaces' sub-millisecond RTT, concurrent TCP uploads lock each other out for
    seconds at a time (measured: 898 vs 25 Mbit/s for two uploads over 12 s; a job's connect timed out behind 15
    others), which is not the TCP fairness of the paper's WAN."""
    out = [["ip", "link", "add", ifb, "type", "ifb"], ["ip", "link", "set", ifb, "up"]]
    if kind == "fifo":
        out.append(["tc", "qdisc", "add", "dev", ifb, "root", "tbf", "rate", f"{LINK_MBIT}mbit", "burst", "256kb",
                    "latency", "20ms"])
    elif kind == "fair":
        share = max(1, LINK_MBIT // (len(sources) + 1))
        out += [["tc", "qdisc", "add", "dev", ifb, "root", "handle", "1:", "htb", "default", "2"],
                ["tc", "class", "add", "dev", ifb, "parent", "1:", "classid", "1:1", "htb", "rate", f"{LINK_MBIT}mbit",
                 "ceil", f"{LINK_MBIT}mbit", "burst", "256k", "cburst", "256k"]]
        for i, src in enumerate(["*", *sources]):
            cls = f"1:{i + 2:x}"
            out += [["tc", "class", "add", "dev", ifb, "parent", "1:1", "classid", cls, "htb", "rate", f"{share}mbit",
                     "ceil", f"{LINK_MBIT}mbit", "burst", "128k", "cburst", "128k", "quantum", "65536"],
                    ["tc", "qdisc", "add", "dev", ifb, "parent", cls, "bfifo", "limit", "512000"]]
            if src != "*":
                out.append(["tc", "filter", "add", "dev", ifb, "parent", "1:", "protocol", "ip", "prio", "1", "u32",
                            "match", "ip", "src", f"{src}/32", "flowid", cls])
    else:
        raise ValueError(f"link {kind!r}: fifo or fair")
    out += [["tc", "qdisc", "add", "dev", dev, "handle", "ffff:", "ingress"],
            ["tc", "filter", "add", "dev", dev, "parent", "ffff:", "protocol", "all", "u32", "match", "u32", "0", "0",
             "action", "mirred", "egress", "redirect", "dev", ifb]]
    return out


def parse_ns(text: str | None, full: bool) -> list[int]:
    if full:
        return list(range(1, MAX_OTHERS + 1))
    if not text:
        return list(DEFAULT_NS)
    ns = sorted({int(x) for x in text.split(",")})
    if not ns or ns[0] < 1 or ns[-1] > MAX_OTHERS:
        raise ValueError(f"N must be in 1..{MAX_OTHERS}")
    return ns


# -- in the jobs and in the WAN namespace -----------------------------------------------------------------------
# Runs as each job, in its own network namespace: argv label sink_host sink_port gateway congestion_control.
UPLOADER = r'''
import json, os, socket, sys, time
label, host, port, gateway, cc = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5]

def put(name, data):
    with open(name + ".tmp", "w") as f:
        json.dump(data, f)
    os.rename(name + ".tmp", name)

u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
u.connect((gateway, 9))  # no packet: only picks the source address
put("me.json", {"label": label, "address": u.getsockname()[0]})
buf = os.urandom(1 << 18)
k, idle_since = 1, time.time()
while not os.path.exists("done"):
    name = "round-%d.json" % k
    if not os.path.exists(name):
        if time.time() - idle_since > 1800:
            sys.exit("no round for 30 min")
        time.sleep(0.05)
        continue
    with open(name) as f:
        r = json.load(f)
    res = {"sent": 0}
    if r["send"]:
        time.sleep(max(0.0, r["start_at"] - time.time()))
        end = r["start_at"] + r["seconds"]
        s, res["connects"] = None, 0
        while s is None and time.time() < end - 1:
            # An upload client tries again: behind 15 saturating uploads a SYN can be lost more often than the
            # kernel's retries (1, 3, 7 s) allow within a round.
            c = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            try:
                if cc != "default":
                    c.setsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, cc.encode())
                c.settimeout(2.0)
                res["connects"] += 1
                c.connect((host, port))
                s = c
            except OSError as e:
                c.close()
                res["error"] = "connect: %s (%d tries)" % (e, res["connects"])
        if s is not None:
            res.pop("error", None)
            try:
                with s:
                    s.settimeout(max(5.0, end - time.time()))
                    res["cc"] = s.getsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, 16).rstrip(b"\0").decode()
                    res["t0"] = time.time()
                    while time.time() < end:
                        s.sendall(buf)
                        res["sent"] += len(buf)
                    res["t1"] = time.time()
            except OSError as e:
                res["error"] = str(e)
    put("sent-%d.json" % k, res)
    k, idle_since = k + 1, time.time()
'''


def submit_file(j, pool, cc: str) -> str:
    """An uploader's submit file: file transfer (uploader.py is sent; python3 is the EP's), its group's lines."""
    extra = "accounting_group = cms\naccounting_group_user = alice\n" if j.group == "cms" else ""
    return (f'executable = /usr/bin/python3\ntransfer_executable = false\n'
            f'arguments = "uploader.py {j.label} {pool.WAN_SERVER} {SINK_PORT} {pool.GATEWAY} {cc}"\n'
            "output = out.txt\nerror = err.txt\nlog = log.txt\n"
            "should_transfer_files = YES\nwhen_to_transfer_output = ON_EXIT\ntransfer_input_files = uploader.py\n"
            f"request_cpus = 1\nrequest_memory = 64\n{extra}queue\n")


def sink(port: int, out: str, interval: float) -> None:
    """Accept uploads on `port`, count bytes per source address; every `interval` s append a JSON line
    {"t": time, "bytes": {address: total so far}} to `out`."""
    srv = socket.create_server(("0.0.0.0", port), backlog=64)
    srv.setblocking(False)
    sel = selectors.DefaultSelector()
    sel.register(srv, selectors.EVENT_READ)
    totals: dict[str, int] = {}
    buf = memoryview(bytearray(1 << 20))
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    with open(out, "a", buffering=1) as f:
        next_at = time.time() + interval
        while True:
            for key, _ in sel.select(timeout=max(0.0, next_at - time.time())):
                if key.fileobj is srv:
                    try:
                        c, (addr, _p) = srv.accept()
                    except BlockingIOError:
                        continue
                    c.setblocking(False)
                    totals.setdefault(addr, 0)
                    sel.register(c, selectors.EVENT_READ, addr)
                    continue
                try:
                    n = key.fileobj.recv_into(buf)
                except (BlockingIOError, InterruptedError):
                    continue
                except OSError:
                    n = 0
                if n:
                    totals[key.data] += n
                else:
                    sel.unregister(key.fileobj)
                    key.fileobj.close()
            now = time.time()
            if now >= next_at:
                f.write(json.dumps({"t": now, "bytes": totals}) + "\n")
                next_at += interval
                if next_at < now:
                    next_at = now + interval


def read_samples(path: Path) -> list[tuple[float, dict]]:
    out = []
    for line in path.read_text().splitlines():
        try:
            d = json.loads(line)
        except ValueError:
            continue                 # a line being written
        out.append((d["t"], d["bytes"]))
    return out


# -- the run ----------------------------------------------------------------------------------------------------
@dataclass
class Job:
    label: str
    user: str
    group: str
    cluster: int = 0
    address: str = ""


def make_jobs() -> list[Job]:
    jobs = [Job("cms-a", "alice", "cms"), Job("cms-b", "alice", "cms")]
    jobs += [Job(f"other-{i}", "bob" if i % 2 else "carol", "other") for i in range(1, MAX_OTHERS + 1)]
    return jobs


class Bench:
    def __init__(self, pool, args):
        self.pool, self.args = pool, args
        self.jobs = make_jobs()
        self.by_label = {j.label: j for j in self.jobs}
        self.k = 0
        self.sink_proc: subprocess.Popen | None = None
        self.samples_path = pool.POOL / "paper_wan_sink.jsonl"
        self.mechanism_key: str | None = args.mechanism    # what goes into [wan] mechanism (check_mechanism)
        self.resubmitted: list[str] = []                    # jobs that ended before running, and why
        self._scratch: dict[int, Path] = {}                 # cluster -> its scratch directory on its EP

    def path(self, j: Job) -> Path:
        """The job's submit directory (its event log, and its files once it ended)."""
        return self.pool.HOME / j.user / f"wan-{j.label}"

    def live(self, j: Job) -> Path | None:
        """The running job's working directory on its EP, where it reads the round files and writes its reports;
        None while it has not started and after it ended."""
        d = self._scratch.get(j.cluster)
        if d is None or not d.is_dir():
            d = self.pool.job_scratch(self.path(j) / "log.txt", f"{j.cluster}.0")
            if d is not None:
                self._scratch[j.cluster] = d
        return d

    def running(self, j: Job) -> Path:
        d = self.live(j)
        if d is None:
            raise RuntimeError(f"job {j.label} (cluster {j.cluster}) is not running any more; its event log: "
                               f"{', '.join(eventlog.starts(self.path(j) / 'log.txt').get(f'{j.cluster}.0', []))}")
        return d

    def has(self, j: Job, name: str) -> bool:
        d = self.live(j)
        return d is not None and (d / name).exists()

    def restarts(self) -> list[str]:
        """A line for each job (its last cluster) whose event log shows other than exactly one start."""
        out = []
        for j in self.jobs:
            if j.cluster:
                for job, events in eventlog.not_once(self.path(j) / "log.txt", [f"{j.cluster}.0"]).items():
                    out.append(f"{j.label}: {eventlog.describe(job, events)}")
        return out

    # -- WAN side
    def shape_wan(self) -> None:
        """The 1 Gbit/s WAN link, on the WAN namespace's side of wan0: w0's ingress mirrored to an ifb shaped by
        link_commands (after the jobs have their addresses: the fair link has a class per job)."""
        wan = f"{self.pool.PREFIX}wan"
        for argv in link_commands(self.args.link, [j.address for j in self.jobs]):
            self.pool.run(["ip" if argv[0] == "ip" else "tc", "-n", wan, *argv[1:]])

    def start_sink(self) -> None:
        self.samples_path.unlink(missing_ok=True)
        err = open(self.pool.POOL / "paper_wan_sink.log", "a")
        self.sink_proc = subprocess.Popen(self.pool.in_ns("wan", [sys.executable, str(Path(__file__).resolve()),
                                                                   "--sink", str(self.samples_path)]),
                                          stdout=err, stderr=err)
        deadline = time.time() + 10
        while not self.samples_path.exists():
            if self.sink_proc.poll() is not None or time.time() > deadline:
                raise RuntimeError(f"WAN sink did not start; see {self.pool.POOL}/paper_wan_sink.log")
            time.sleep(0.1)

    def stop_sink(self) -> None:
        p, self.sink_proc = self.sink_proc, None
        if p is not None and p.poll() is None:
            os.kill(p.pid, signal.SIGTERM)
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                os.kill(p.pid, signal.SIGKILL)
                p.wait(5)

    def switch_drops(self) -> int | None:
        """socket_drops of the core switch's namespace now (None if ss cannot tell)."""
        cp = self.pool.run(self.pool.in_ns("core", ["ss", "-0", "-m", "-a", "-n"]), check=False)
        return socket_drops(cp.stdout) if cp.returncode == 0 else None

    # -- controller
    def status(self) -> dict:
        cp = self.pool.controller_cli("status", "--config", str(self.pool.POOL / "controller.toml"), "--json")
        return json.loads(cp.stdout)

    def group_bytes(self) -> dict[str, int]:
        return {g["group"]: g["bytes"] for g in self.status().get("wan_groups", [])}

    def wait_registered(self, rates: dict | None, timeout: float = 60) -> None:
        """Every job registered with the controller, in its group when groups are configured."""
        want_groups = {"cms": 2, "other": MAX_OTHERS} if rates else {}
        deadline = time.time() + timeout
        seen = {}
        while time.time() < deadline:
            st = self.status()
            seen = {"jobs": st["totals"]["jobs"],
                    "groups": {g["group"]: g["jobs"] for g in st.get("wan_groups", [])}}
            if seen["jobs"] >= len(self.jobs) and seen["groups"] == want_groups and \
                    all(g["rate_mbit"] == rates[g["group"]] for g in st.get("wan_groups", [])):
                return
            time.sleep(1)
        raise RuntimeError(f"controller: jobs not registered as configured after {timeout:.0f} s: {seen}")

    def switch_meters(self) -> str:
        pool = self.pool
        cp = pool.run(["ovs-ofctl", "-O", "OpenFlow13", "dump-meters", f"unix:{pool.OVS_DIR}/{pool.SWITCH}.mgmt"],
                      check=False, env=pool._ovs_env())
        return cp.stdout

    def configure(self, rates: dict | None) -> None:
        log.info("controller: %s", f"WAN groups {rates} ({self.args.mechanism})" if rates else "no WAN groups")
        self.pool.reconfigure_controller(wan_policies(rates, self.mechanism_key, **queue_place(self.pool)))
        self.wait_registered(rates)
        meters = [line for line in self.switch_meters().splitlines() if "meter=" in line]
        if rates is None and self.args.mechanism == "meter" and meters:
            raise RuntimeError(f"management off but the switch still has meters: {meters}")
        log.info("switch meters: %s", "; ".join(m.strip() for m in meters) or "none")
        if self.args.mechanism == "queue":
            queues, deadline = self.switch_queues(), time.monotonic() + 15
            while rates is None and queues and time.monotonic() < deadline:   # removed at the switch's connect
                time.sleep(0.5)
                queues = self.switch_queues()
            if rates is None and queues:
                raise RuntimeError(f"management off but the switch still has Lark's queues: {queues}")
            log.info("switch queues: %s", queues or "none")

    def switch_queues(self) -> str:
        """Lark's Queue rows on the core switch (the controller marks them lark-owner=controller)."""
        pool = self.pool
        cp = pool.vsctl("--columns=external_ids,other_config", "find", "Queue",
                        "external_ids:lark-owner=controller", check=False)
        return " ".join(cp.stdout.split())

    # -- jobs
    def submit(self, j: Job) -> None:
        pool = self.pool
        j.cluster = pool.submit_as(j.user, f"wan-{j.label}", submit_file(j, pool, self.args.cc),
                                   files={"uploader.py": UPLOADER})

    def submit_all(self) -> None:
        for j in self.jobs:
            self.submit(j)
        log.info("submitted %d uploader jobs: clusters %d-%d", len(self.jobs), self.jobs[0].cluster,
                 self.jobs[-1].cluster)
        self._wait_files(self.jobs, "me.json", 300, resubmit=2)
        for j in self.jobs:
            j.address = json.loads((self.running(j) / "me.json").read_text())["address"]
        log.info("all %d jobs run: %s", len(self.jobs), ", ".join(f"{j.label}={j.address}" for j in self.jobs))

    def _wait_files(self, jobs: list[Job], name: str, timeout: float, resubmit: int = 0) -> None:
        """Until every job wrote `name`. With `resubmit`, a job that left the queue without writing it (Lark could
        not set up its network: the reason is in its err.txt, back in its submit directory) is submitted again, at
        most that many times."""
        deadline, check_at, again = time.time() + timeout, time.time() + 5, 0
        while True:
            missing = [j for j in jobs if not self.has(j, name)]
            if not missing:
                return
            if resubmit and time.time() >= check_at:
                check_at = time.time() + 5
                cp = self.pool.run(self.pool.in_machine("cm", ["condor_q", *(str(j.cluster) for j in missing),
                                                               "-af", "ClusterId"]), check=False)
                queued = set(cp.stdout.split()) if cp.returncode == 0 else {str(j.cluster) for j in missing}
                for j in missing:
                    if str(j.cluster) not in queued and not self.has(j, name) and again < resubmit:
                        err_txt = self.path(j) / "err.txt"
                        err = err_txt.read_text(errors="replace").strip()[-400:] if err_txt.exists() else ""
                        log.warning("job %s (cluster %d) ended before it ran: %s; submitting it again",
                                    j.label, j.cluster, err or "no error output")
                        self.resubmitted.append(f"{j.label}: {err}")
                        self.submit(j)
                        again += 1
            if time.time() > deadline:
                cp = self.pool.run(self.pool.in_machine("cm", ["condor_q", *(str(j.cluster) for j in missing),
                                                               "-af:t", "ClusterId", "JobStatus", "HoldReason"]),
                                   check=False)
                raise RuntimeError(f"jobs {[j.label for j in missing]} wrote no {name} in {timeout:.0f} s: "
                                   f"{cp.stdout.strip()}")
            time.sleep(0.2)

    def _put(self, path: Path, data: dict) -> None:
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(data))
        tmp.chmod(0o644)
        tmp.rename(path)

    def round(self, senders: list[str], name: str) -> dict:
        """One round: `senders` upload at once for args.seconds; goodput per job and the per-second series."""
        self.k += 1
        seconds = self.args.seconds
        before = self.group_bytes()  # nothing uploads between rounds: the meters' counters stand still
        drops_before = self.switch_drops()
        start_at = time.time() + 2.0
        for j in self.jobs:
            self._put(self.running(j) / f"round-{self.k}.json",
                      {"send": j.label in senders, "start_at": start_at, "seconds": seconds})
        self._wait_files(self.jobs, f"sent-{self.k}.json", seconds + 60)
        time.sleep(2.5)              # the controller polls meter stats every 2 s; the sink samples every 0.5 s
        after = self.group_bytes()
        samples = read_samples(self.samples_path)
        t0, t1 = start_at + WARMUP, start_at + seconds - TAIL
        drops = self.switch_drops()
        res = {"name": name, "start_at": start_at, "seconds": seconds, "goodput": {}, "series": {}, "sent": {},
               "switch_drops": None if drops is None or drops_before is None else drops - drops_before,
               # what each group's meter took in (it counts what it then drops) or its queue sent, over the round
               "offered": {g: (after[g] - before.get(g, 0)) * 8 / seconds / 1e6 for g in after}}
        for label in senders:
            j = self.by_label[label]
            sent = json.loads((self.running(j) / f"sent-{self.k}.json").read_text())
            if "error" in sent:      # counted as what the sink got from it (0 if it never connected)
                log.warning("round %s: job %s: %s", name, label, sent["error"])
            res["sent"][label] = sent
            res["goodput"][label] = rate_between(samples, j.address, t0, t1)
            res["series"][label] = series(samples, [j.address], start_at, start_at + seconds)
        log.info("round %s: %s", name, ", ".join(f"{k}={v:.1f}" for k, v in res["goodput"].items()))
        return res

    def finish_jobs(self) -> None:
        for j in self.jobs:
            if (d := self.live(j)) is not None:
                self._put(d / "done", {})
        clusters = [str(j.cluster) for j in self.jobs if j.cluster]
        deadline = time.time() + 60
        while clusters and time.time() < deadline:
            cp = self.pool.run(self.pool.in_machine("cm", ["condor_q", *clusters, "-af", "ClusterId"]), check=False)
            if cp.returncode == 0 and not cp.stdout.strip():
                return
            time.sleep(1)
        if clusters:
            self.pool.run(self.pool.in_machine("cm", ["condor_rm", *clusters]), check=False)


def fig10_result(r: dict, rates: dict) -> Fig10:
    return Fig10(rates, dict(r["goodput"]), {"cms": ["cms-a", "cms-b"], "other": ["other-1", "other-2"]},
                 r["offered"])


def fig12_rows(managed: dict[int, dict], unmanaged: dict[int, dict]) -> list[Fig12Row]:
    rows = []
    for n in sorted(set(managed) | set(unmanaged)):
        w, wo = managed.get(n, {"goodput": {}}), unmanaged.get(n, {"goodput": {}})
        nan = float("nan")
        others_w = [v for k, v in w["goodput"].items() if k.startswith("other-")]
        others_wo = [v for k, v in wo["goodput"].items() if k.startswith("other-")]
        rows.append(Fig12Row(n, w["goodput"].get("cms-a", nan), wo["goodput"].get("cms-a", nan),
                             sum(others_w) if others_w else nan, sum(others_wo) if others_wo else nan,
                             min(others_w) if others_w else nan, max(others_w) if others_w else nan,
                             w.get("switch_drops")))
    return rows


def plot(fig10: tuple[Fig10, dict] | None, rows: list[Fig12Row], f10_path: Path, f12_path: Path) -> list[Path]:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log.warning("matplotlib not installed: no PNG (make bench installs it)")
        return []
    OUT.mkdir(parents=True, exist_ok=True)
    written = []
    if fig10 is not None:
        f, r = fig10
        fig, axes = plt.subplots(1, 2, figsize=(12, 4.2), sharey=True)
        for g, labels in f.groups.items():
            pts: dict[float, float] = {}
            for label in labels:
                for t, v in r["series"][label]:
                    pts[round(t, 2)] = pts.get(round(t, 2), 0.0) + v
            ts = sorted(pts)
            axes[0].plot(ts, [pts[t] for t in ts], label=f"{g} (limit {f.rates[g]:g} Mbit/s)")
            axes[0].axhline(f.rates[g], ls="--", lw=0.8, color="grey")
            for label in labels:
                axes[1].plot([t for t, _ in r["series"][label]], [v for _, v in r["series"][label]],
                             label=f"{label} ({g})")
        axes[0].set_title("(a) aggregate WAN upload per accounting group")
        axes[1].set_title("(b) each job")
        for ax in axes:
            ax.axvspan(0, WARMUP, color="grey", alpha=0.1)
            ax.set_xlabel("time since the common start (s)")
            ax.grid(alpha=0.3)
            ax.legend(fontsize=8)
        axes[0].set_ylabel("goodput at the WAN sink (Mbit/s, 1 s)")
        fig.suptitle("Fig. 10 on the pool testbed: WAN groups cms 250 / other 100 Mbit/s, 1 Gbit/s WAN link")
        fig.tight_layout()
        fig.savefig(f10_path, dpi=100)
        plt.close(fig)
        written.append(f10_path)
    if rows:
        fig, axes = plt.subplots(1, 2, figsize=(12, 4.2))
        ns = [r.n for r in rows]
        axes[0].plot(ns, [r.cms_with for r in rows], "o-", label="with management (cms 900, others 100)")
        axes[0].plot(ns, [r.cms_without for r in rows], "s-", label="without management")
        axes[0].plot(ns, [LINK_MBIT / (n + 1) for n in ns], ":", color="grey", label="link / (N+1)")
        axes[0].axhline(FIG12_RATES["cms"], ls="--", lw=0.8, color="grey")
        axes[0].set_xlabel("number of non-CMS jobs N")
        axes[0].set_ylabel("CMS job goodput (Mbit/s)")
        axes[0].set_title("CMS job throughput")
        axes[1].plot(ns, [r.speedup for r in rows], "o-", label="speed-up here")
        axes[1].plot(range(1, len(PAPER_TABLE3) + 1), PAPER_TABLE3, "x--", label="paper, Table III")
        axes[1].set_xlabel("number of non-CMS jobs N")
        axes[1].set_ylabel("time without / time with")
        axes[1].set_title("CMS job speed-up from WAN management")
        for ax in axes:
            ax.grid(alpha=0.3)
            ax.legend(fontsize=8)
        fig.suptitle("Fig. 12 / Table III on the pool testbed: 1 Gbit/s WAN link")
        fig.tight_layout()
        fig.savefig(f12_path, dpi=100)
        plt.close(fig)
        written.append(f12_path)
    return written


def check_mechanism(pool, mechanism: str) -> str | None:
    """The value for `[wan] mechanism`, checked by the controller's own config loader: None when the controller in
    this tree predates the key and meters were asked for (its only mechanism); refuses anything else it rejects."""
    from lark.controller.config import from_mapping
    from lark.errors import LarkError
    text = wan_policies(FIG10_RATES, mechanism, **queue_place(pool))
    try:
        from_mapping(tomllib.loads(pool.controller_config(text)), base_dir=str(pool.POOL))
    except LarkError as e:
        if mechanism != "meter":
            raise SystemExit(f"paper_wan: the controller in this tree refuses [wan] mechanism = {mechanism!r}: {e}")
        log.warning("the controller does not know [wan] mechanism yet (%s); using its meters without the key", e)
        return None
    return mechanism


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mechanism", choices=["meter", "queue"], default="queue",
                    help="the controller's [wan] mechanism (default queue)")
    ap.add_argument("--full", action="store_true", help="Fig. 12 for every N in 1..15")
    ap.add_argument("--ns", help="Fig. 12 for these N, e.g. 1,4,15 (default 1,2,4,8,15)")
    ap.add_argument("--seconds", type=float, default=float(os.environ.get("BENCH_SECONDS", "20")),
                    help="upload time per round (s), default 20")
    ap.add_argument("--only", choices=["fig10", "fig12"], help="run one figure only")
    ap.add_argument("--cc", default="reno",
                    help="the uploads' TCP congestion control (default reno; 'default' = the kernel's, bbr here)")
    ap.add_argument("--link", choices=["fair", "fifo"], default="fair",
                    help="the WAN link's queue: fair (per source, default) or fifo (drop-tail); see link_commands")
    ap.add_argument("--sink", help=argparse.SUPPRESS)      # internal: the WAN sink, in the WAN namespace
    args = ap.parse_args()
    if args.sink:
        sink(SINK_PORT, args.sink, INTERVAL)
        return 0
    logging.basicConfig(level=logging.INFO, format="paper-wan %(asctime)s %(message)s", datefmt="%H:%M:%S")
    ns = parse_ns(args.ns, args.full)
    if args.seconds < WARMUP + TAIL + 3:
        raise SystemExit(f"paper_wan: --seconds must be at least {WARMUP + TAIL + 3:g}")
    import pool  # noqa: E402 (the testbed, stdlib only)

    pool.tb.prepare("bench/paper_wan.py")
    if not pool.controller_available():
        raise SystemExit("paper_wan: lark-controller is not installed in this tree's venv (make deps)")
    if pool.tb.load_state().get("master_pid"):
        pool.tb.stop()  # the one-machine testbed runs from the same root
    bench = Bench(pool, args)
    bench.mechanism_key = check_mechanism(pool, args.mechanism)
    fig10 = None
    managed: dict[int, dict] = {}
    unmanaged: dict[int, dict] = {}
    t_start = time.monotonic()
    try:
        first = FIG10_RATES if args.only != "fig12" else FIG12_RATES
        pool.start(policies=wan_policies(first, bench.mechanism_key, **queue_place(pool)), slots_per_ep=SLOTS_PER_EP,
                   ep_condor="# bench/paper_wan.py: no Bandwidth resource, so no slot holds a share of the EP\n"
                             "MACHINE_RESOURCE_INVENTORY_Bandwidth =\n",
                   larkd_knobs={"default_bandwidth": "unlimited", "controller_resync": "5"})
        bench.start_sink()
        bench.submit_all()
        bench.shape_wan()
        bench.wait_registered(first)
        if args.only != "fig12":
            r = bench.round(["cms-a", "cms-b", "other-1", "other-2"], "fig10")
            fig10 = (fig10_result(r, FIG10_RATES), r)
        if args.only != "fig10":
            if first is not FIG12_RATES:
                bench.configure(FIG12_RATES)
            for n in ns:
                managed[n] = bench.round(["cms-a", *[f"other-{i}" for i in range(1, n + 1)]], f"fig12-with-N{n}")
            bench.configure(None)
            for n in ns:
                unmanaged[n] = bench.round(["cms-a", *[f"other-{i}" for i in range(1, n + 1)]],
                                           f"fig12-without-N{n}")
        bench.finish_jobs()
    finally:
        bench.stop_sink()
        try:                             # before pool.down(), which moves the submit directories away
            restarted = bench.restarts()
        except (OSError, ValueError) as e:
            restarted = [f"the jobs' event logs could not be read: {e}"]
        for line in restarted:
            log.error("did not start exactly once: %s", line)
        pool.down()
        left = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
        if pool.PREFIX in left:
            log.error("pool namespaces are still there: %s", left)
    wall = time.monotonic() - t_start
    if restarted:
        print(f"\npaper_wan: no figures from this run: {len(restarted)} job(s) did not start exactly once (an "
              "evicted uploader misses rounds or joins them twice):")
        for line in restarted:
            print(f"  {line}")
        return 1

    rows = fig12_rows(managed, unmanaged)
    pngs = plot(fig10, rows, OUT / "paper_wan_fig10.png", OUT / "paper_wan_fig12.png")
    print(f"\nWAN link {LINK_MBIT} Mbit/s ({args.link}), TCP {args.cc}, mechanism {args.mechanism}, "
          f"{args.seconds:g} s per round (averages leave out the first {WARMUP:g} s and the last {TAIL:g} s), "
          f"{os.cpu_count()} CPUs (shared machine), wall {wall:.0f} s")
    if fig10 is not None:
        print("\nFig. 10: cms 250 Mbit/s, other 100 Mbit/s, two jobs of each group at once (goodput at the sink)")
        print(fig10_table(fig10[0]))
    if rows:
        print("\nFig. 12 / Table III: one cms job (900 Mbit/s) and N other jobs (100 Mbit/s shared), "
              "with and without management")
        print(fig12_table(rows))
    if pngs:
        print("\nplots: " + ", ".join(str(p) for p in pngs))
    for why in bench.resubmitted:
        print(f"resubmitted (ended before it ran): {why}")
    print(summary(fig10[0] if fig10 else None, rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
