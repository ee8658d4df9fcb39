"""lark-controller capacity (issue 26): many simulated EPs against the real controller process and a real OVS switch.

Everything is real but the EPs: the controller (`lark-controller run`, log level INFO as in production) programs a
private OVS switch (userspace datapath) over OpenFlow TLS; each simulated EP has its own certificate (OU lark-ep)
and, like larkd, one kept-alive mutual-TLS connection on which it makes one request at a time. The load comes from
client processes (asyncio) in the controller's network namespace, on the same 2-vCPU machine.

Phases:
  1. connect: every EP's TLS handshake.
  2. registrations, open loop: EPs together offer BENCH_RATE registrations/s (each EP one every EPs/RATE s) for
     BENCH_SECONDS; a registration's latency runs from the moment it was due (a late send counts against the
     controller) to the answer, which the controller gives after the switch acknowledged the flows (barrier).
     reg_per_s and reg_p99_ms are this phase's: at an offered rate the controller cannot serve, p99 is the queue.
  2b. latency at a sustainable rate: the same, offered at BENCH_LATENCY_RATE (default half of BENCH_RATE), after the
     first phase's answers are all in; its p99 is what a registration costs when the controller keeps up
     (lat_p99_ms in the last line).
  3. resync: every EP at once sends its full list (BENCH_JOBS / EPs jobs; its registered ones among them), as after a
     controller restart; resync_s is from the first request to the last answer, with all flows acknowledged.
     Then the same resync again (nothing changed: what a periodic resync costs).
  4. the controller's RSS (/proc, VmRSS) and the flows on the switch (ovs-ofctl dump-aggregate).

Environment: BENCH_EPS (1000), BENCH_RATE (2000), BENCH_LATENCY_RATE (BENCH_RATE / 2; 0: no phase 2b),
BENCH_SECONDS (10, each registration phase), BENCH_JOBS (100000), BENCH_CLIENTS (2),
BENCH_WORKERS ([api] workers; the controller's default), BENCH_KEEP=1 (keep the controller's and OVS's logs),
BENCH_PLAIN_OPENFLOW=1 (diagnosis: OpenFlow over plain TCP), BENCH_LABELS=1 (the label scheme, `[labels] mode = "vlan"`:
each simulated EP gets an [ep.NAME] section with its address range and a switch port of its own, a patch port to a
second bridge, so the core's per-EP flows are really installed). Root; not part of `make test`; ~1.5 min here.
Figures and what they mean: docs/controller.md, "Capacity".
Prints a table, the goals with met/missed, then one line:
`jobs=... flows_total=... reg_per_s=... reg_p99_ms=... resync_s=... rss_mb=... lat_p99_ms=...`.
"""
from __future__ import annotations

import asyncio
import ipaddress
import json
import logging
import os
import re
import resource
import shutil
import ssl
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
from helpers.sdn import BRIDGE, PY, SLICE_AND_WAN_POLICIES, SdnPool, sh

from lark.controller import certs

log = logging.getLogger("bench.controller_capacity")
EPS = int(os.environ.get("BENCH_EPS", "1000"))
RATE = float(os.environ.get("BENCH_RATE", "2000"))
LAT_RATE = float(os.environ.get("BENCH_LATENCY_RATE", str(RATE / 2)))
SECONDS = float(os.environ.get("BENCH_SECONDS", "10"))
JOBS = int(os.environ.get("BENCH_JOBS", "100000"))
CLIENTS = int(os.environ.get("BENCH_CLIENTS", "2"))
WORKERS = os.environ.get("BENCH_WORKERS", "")    # [api] workers; "" = the controller's default
KEEP = os.environ.get("BENCH_KEEP", "") == "1"   # keep the pool's directory (controller and OVS logs)
PLAIN_OF = os.environ.get("BENCH_PLAIN_OPENFLOW", "") == "1"   # diagnosis only: OpenFlow over plain TCP
LABELS = os.environ.get("BENCH_LABELS", "") == "1"
GOALS = {"reg_per_s": (">=", 2000.0), "reg_p99_ms": ("<=", 20.0), "resync_s": ("<=", 10.0), "rss_mb": ("<=", 500.0),
         "lat_p99_ms": ("<=", 20.0)}   # the p99 goal read at a sustainable rate (phase 2b), next to the strict one


def ep_name(e: int) -> str:
    return f"sep{e:04d}"


def ep_port(e: int) -> str:
    return f"sp{e:04d}"


def ep_network(e: int) -> ipaddress.IPv4Network:
    """EP e's job addresses (job() numbers its jobs from e * 4096)."""
    return ipaddress.IPv4Network((0x0A800000 + e * 4096, 20))


def job(e: int, j: int) -> dict:
    """Job j of EP e: its own MAC and address, one of 1,000 owners, a third in a WAN-steered group."""
    idx = e * 4096 + j
    return {"key": f"slot{j}", "job_id": f"{1000 + e}.{j}", "owner": f"user{(e * 7 + j) % 1000}",
            "accounting_group": "cms" if j % 3 == 0 else "",
            "addresses": [str(ipaddress.IPv4Address(0x0A800000 + idx))],
            "mac": f"02:7a:{e >> 8 & 255:02x}:{e & 255:02x}:{j >> 8 & 255:02x}:{j & 255:02x}"}


def raise_fd_limit() -> None:
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 2 * EPS + 256:
        raise SystemExit(f"the open-file limit {hard} is too low for {EPS} EPs (raise it: ulimit -Hn)")
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


# -- the load: one client process drives a share of the EPs ---------------------------------------------------------
async def _conn(port: int, ctx: ssl.SSLContext):
    return await asyncio.open_connection("127.0.0.1", port, ssl=ctx, server_hostname="127.0.0.1")


async def _request(conn, method: str, path: str, body: object) -> tuple[int, dict]:
    reader, writer = conn
    data = json.dumps(body).encode()
    writer.write(f"{method} {path} HTTP/1.1\r\nHost: c\r\nContent-Type: application/json\r\n"
                 f"Content-Length: {len(data)}\r\n\r\n".encode() + data)
    await writer.drain()
    head = await reader.readuntil(b"\r\n\r\n")
    m = re.search(rb"Content-Length: (\d+)", head)
    answer = await reader.readexactly(int(m.group(1)) if m else 0)
    return int(head.split()[1]), json.loads(answer or b"{}")


async def _client(spec: dict) -> dict:
    port, tls, mine = spec["port"], Path(spec["tls"]), spec["eps"]
    ctxs = {}
    for e in mine:
        ctx = ssl.create_default_context(cafile=str(tls / "ca.pem"))
        ctx.load_cert_chain(str(tls / f"{ep_name(e)}.pem"), str(tls / f"{ep_name(e)}.key"))
        ctxs[e] = ctx
    conns: dict[int, tuple] = {}
    gate = asyncio.Semaphore(32)   # handshakes at once: below the API's max_handshakes

    async def connect(e: int) -> None:
        async with gate:
            conns[e] = await _conn(port, ctxs[e])

    async def call(e: int, method: str, path: str, body: object) -> tuple[int, dict]:
        """One request on the EP's kept-alive connection; a connection the controller closed (idle > 10 s) is
        opened again, as larkd's client does."""
        for attempt in range(5):
            try:
                return await _request(conns[e], method, path, body)
            except (ConnectionError, asyncio.IncompleteReadError, ssl.SSLError, OSError) as err:
                if attempt == 4:
                    return 599, {"error": f"no answer after 5 connections: {err!r}"}
                await asyncio.sleep(0.1 * attempt)
                try:
                    async with gate:
                        conns[e] = await _conn(port, ctxs[e])
                except (ConnectionError, ssl.SSLError, OSError):
                    pass   # the next attempt's request fails on the old connection and connects again
        raise AssertionError("unreachable")

    out: dict = {"errors": []}
    t = time.perf_counter()
    await asyncio.gather(*(connect(e) for e in mine))
    out["connect_s"] = time.perf_counter() - t

    async def registrations(start: float, period: float, first: int, n: int) -> dict:
        """Open loop from a common start time: EP e's registration j is due at start + (e / EPs + j) * period."""
        lat: list[float] = []
        server: list[float] = []
        done_at: list[float] = []

        async def register(e: int) -> None:
            for j in range(n):
                due = start + (e / spec["eps_total"] + j) * period
                delay = due - time.time()
                if delay > 0:
                    await asyncio.sleep(delay)
                code, body = await call(e, "POST", "/v1/jobs", job(e, first + j))
                now = time.time()
                if code != 200:
                    out["errors"].append(f"{ep_name(e)} job {first + j}: {code} {body.get('error')}")
                    continue
                lat.append((now - due) * 1000)
                server.append(body["ms"])
                done_at.append(now)
        await asyncio.gather(*(register(e) for e in mine))
        return {"lat": lat, "server": server, "last": max(done_at, default=0.0)}

    # phase 2: throughput, at the offered rate
    out.update(await registrations(spec["start"], spec["period"], 0, spec["per_ep"]))
    Path(f"{spec['out']}.registered-done").touch()
    # phase 2b: latency at a sustainable rate, from the start time the parent writes once phase 2 is over
    if spec["lat_per_ep"]:
        while not os.path.exists(spec["go"]["latency"]):
            await asyncio.sleep(0.01)
        start2 = float(Path(spec["go"]["latency"]).read_text())
        out["latency"] = await registrations(start2, spec["lat_period"], spec["per_ep"], spec["lat_per_ep"])
        Path(f"{spec['out']}.latency-done").touch()
    # phase 3: every EP resyncs its full list at once (twice), when the parent says so
    for rnd in ("resync", "resync_again"):
        go = spec["go"][rnd]
        while not os.path.exists(go):
            await asyncio.sleep(0.01)
        t0 = time.time()

        async def resync(e: int, rnd: str = rnd) -> float:
            code, body = await call(e, "PUT", "/v1/sync", {"jobs": [job(e, j) for j in range(spec["jobs_per_ep"])]})
            if code != 200:
                out["errors"].append(f"{ep_name(e)} {rnd}: {code} {body.get('error')}")
            return time.time()
        ends = await asyncio.gather(*(resync(e) for e in mine))
        out[rnd] = [t0, max(ends)]
        Path(f"{spec['out']}.{rnd}-done").touch()
    for _, w in conns.values():
        w.close()
    return out


def client_main(spec_path: str) -> int:
    raise_fd_limit()
    spec = json.loads(Path(spec_path).read_text())
    result = asyncio.run(_client(spec))
    Path(spec["out"]).write_text(json.dumps(result))
    return 0


# -- the bench ------------------------------------------------------------------------------------------------------
class CapacityPool(SdnPool):
    """The test pool's switch and controller, EP certificates for the simulated EPs, quotas and bounds for them."""

    def write_config(self) -> None:
        super().write_config()
        certs.make(str(self.tls), [ep_name(e) for e in range(EPS)])
        per_ep = -(-JOBS // EPS)
        self.cfg_path.write_text(self.cfg_path.read_text().replace(
            "[api]\n", f"[api]\nmax_jobs_per_ep = {max(4096, per_ep)}\nmax_handshakes = 512\n"
                        + (f"workers = {int(WORKERS)}\n" if WORKERS else ""), 1))
        if LABELS:
            # every EP's port on the core before the controller starts (the switch connects with all of them)
            args = ["add-br", "epside", "--", "set", "bridge", "epside", "datapath_type=netdev", "fail_mode=secure"]
            for e in range(EPS):
                a, b = ep_port(e), f"sq{e:04d}"
                args += ["--", "add-port", BRIDGE, a, "--", "set", "interface", a, "type=patch", f"options:peer={b}",
                         "--", "add-port", "epside", b, "--", "set", "interface", b, "type=patch",
                         f"options:peer={a}"]
            self.ovs.vsctl(*args)
            with open(self.cfg_path, "a") as f:
                f.write('[labels]\nmode = "vlan"\n' + "".join(
                    f'[ep.{ep_name(e)}]\nports = ["{ep_port(e)}"]\naddresses = ["{ep_network(e)}"]\n'
                    for e in range(EPS)))

    def start_controller(self) -> None:
        with open(self.log_path, "a") as out:
            self.ctl = subprocess.Popen(["ip", "netns", "exec", self.core, PY, "-m", "lark.controller.cli", "run",
                                         "--config", str(self.cfg_path), "--log-level", "INFO"], stdout=out,
                                        stderr=out)
        self.procs.append(self.ctl)


def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(p / 100 * (len(xs) - 1)))] if xs else float("nan")


def rss_mb(pid: int) -> tuple[float, float]:
    """The controller's VmRSS and VmHWM (peak), MB (10^6 bytes)."""
    fields = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            k, _, v = line.partition(":")
            if k in ("VmRSS", "VmHWM"):
                fields[k] = int(v.split()[0]) * 1024 / 1e6
    return fields["VmRSS"], fields["VmHWM"]


def flows_total(pool: SdnPool) -> int:
    cp = sh(["ovs-ofctl", "-O", "OpenFlow13", "dump-aggregate", f"unix:{pool.ovs.dir}/{BRIDGE}.mgmt"])
    m = re.search(r"flow_count=(\d+)", cp.stdout)
    return int(m.group(1)) if m else -1


def wait_for(outs: list[Path], phase: str, pool: SdnPool, clients: list[subprocess.Popen]) -> None:
    """Until every client has written its marker for the phase."""
    while not all(Path(f"{o}.{phase}-done").exists() for o in outs):
        if pool.ctl.poll() is not None or any(c.poll() is not None for c in clients):
            raise RuntimeError(f"the controller or a client exited during phase {phase}:\n{pool.log()}")
        time.sleep(0.2)


def main() -> int:
    if os.geteuid() != 0:
        print("bench/controller_capacity.py needs root (namespaces, OVS)", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    raise_fd_limit()   # the controller inherits it: one socket per EP
    tmp = Path(tempfile.mkdtemp(prefix="lark-bench-cap-"))
    pool = CapacityPool(str(tmp), policies=SLICE_AND_WAN_POLICIES, reconcile_grace=3600, openflow_tls=not PLAIN_OF)
    clients: list[subprocess.Popen] = []
    rows: list[tuple[str, str]] = []
    try:
        t = time.perf_counter()
        pool.start()
        log.info("pool up with %d EP certificates in %.1f s", EPS, time.perf_counter() - t)
        per_ep = max(1, round(RATE * SECONDS / EPS))
        lat_per_ep = round(LAT_RATE * SECONDS / EPS)
        jobs_per_ep = -(-JOBS // EPS)
        start = time.time() + 5 + EPS / 200      # after every EP's handshake
        go = {rnd: str(tmp / f"go-{rnd}") for rnd in ("latency", "resync", "resync_again")}
        outs = []
        for c in range(CLIENTS):
            spec = {"port": pool.api_port, "tls": str(pool.tls), "eps": list(range(c, EPS, CLIENTS)),
                    "eps_total": EPS, "start": start, "period": EPS / RATE, "per_ep": per_ep,
                    "lat_per_ep": lat_per_ep, "lat_period": EPS / LAT_RATE if LAT_RATE > 0 else 0.0,
                    "jobs_per_ep": jobs_per_ep, "go": go, "out": str(tmp / f"client{c}.json")}
            (tmp / f"client{c}.spec").write_text(json.dumps(spec))
            outs.append(Path(spec["out"]))
            clients.append(subprocess.Popen(["ip", "netns", "exec", pool.core, PY, os.path.abspath(__file__),
                                             "--client", str(tmp / f"client{c}.spec")]))
        # registrations run now: wait for every client's (no polling of the controller's status meanwhile: an
        # admin's status lists every job, a cost that is not the registrations')
        wait_for(outs, "registered", pool, clients)
        st = pool.api("GET", "/v1/status", cert="controller", timeout=60)[1]
        jobs_after_reg = st["totals"]["jobs"]
        rss_reg = rss_mb(pool.ctl.pid)
        if lat_per_ep:
            tmp_go = Path(go["latency"] + ".tmp")
            tmp_go.write_text(repr(time.time() + 2))
            tmp_go.rename(go["latency"])
            wait_for(outs, "latency", pool, clients)
        Path(go["resync"]).touch()
        wait_for(outs, "resync", pool, clients)
        rss_full = rss_mb(pool.ctl.pid)
        flows = flows_total(pool)
        Path(go["resync_again"]).touch()
        for c in clients:
            c.wait(timeout=900)
        results = [json.loads(o.read_text()) for o in outs]
        rss_after = rss_mb(pool.ctl.pid)
    finally:
        for c in clients:
            if c.poll() is None:
                c.kill()
        if KEEP:
            shutil.copy(pool.ovs.dir / "vswitchd.log", tmp / "vswitchd.log")
        pool.close()
    lat = [x for r in results for x in r["lat"]]
    server = [x for r in results for x in r["server"]]
    errors = [x for r in results for x in r["errors"]]
    lat2 = [x for r in results for x in r.get("latency", {}).get("lat", [])]
    server2 = [x for r in results for x in r.get("latency", {}).get("server", [])]
    reg_span = max(r["last"] for r in results) - start
    reg_per_s = len(lat) / reg_span if reg_span > 0 else float("nan")
    resync = {rnd: max(r[rnd][1] for r in results) - min(r[rnd][0] for r in results)
              for rnd in ("resync", "resync_again")}
    jobs = EPS * jobs_per_ep
    figures = {"jobs": jobs, "flows_total": flows, "reg_per_s": reg_per_s, "reg_p99_ms": pct(lat, 99),
               "resync_s": resync["resync"], "rss_mb": max(rss_full[0], rss_after[0]), "lat_p99_ms": pct(lat2, 99)}
    if KEEP:
        print(f"kept {tmp}")
    else:
        shutil.rmtree(tmp, ignore_errors=True)
    rows += [
        ("simulated EPs (one TLS connection each) / client processes", f"{EPS} / {CLIENTS}"),
        ("EP TLS handshakes, all (s, slowest client)", f"{max(r['connect_s'] for r in results):.2f}"),
        ("registrations offered (/s) for (s)", f"{RATE:.0f} for {SECONDS:.0f}"),
        ("registrations answered 200 / errors", f"{len(lat)} / {len(errors)}"),
        ("registrations per second sustained", f"{reg_per_s:.0f}"),
        ("registration latency from due time p50 / p99 / max (ms)",
         f"{pct(lat, 50):.1f} / {pct(lat, 99):.1f} / {max(lat, default=float('nan')):.1f}"),
        ("  of which in the controller p50 / p99 (ms)", f"{pct(server, 50):.1f} / {pct(server, 99):.1f}"),
        ("latency phase: offered (/s) for (s); answered 200", f"{LAT_RATE:.0f} for {SECONDS:.0f}; {len(lat2)}"),
        ("  latency from due time p50 / p99 / max (ms)",
         f"{pct(lat2, 50):.1f} / {pct(lat2, 99):.1f} / {max(lat2, default=float('nan')):.1f}"),
        ("  of which in the controller p50 / p99 (ms)", f"{pct(server2, 50):.1f} / {pct(server2, 99):.1f}"),
        ("jobs after the registrations; controller RSS / peak (MB)",
         f"{jobs_after_reg}; {rss_reg[0]:.0f} / {rss_reg[1]:.0f}"),
        (f"resync of {jobs} jobs, all {EPS} EPs at once (s)", f"{resync['resync']:.2f}"),
        ("the same resync again, nothing changed (s)", f"{resync['resync_again']:.2f}"),
        (f"controller RSS / peak with {jobs} jobs (MB)",
         f"{figures['rss_mb']:.0f} / {max(rss_full[1], rss_after[1]):.0f}"),
        ("flows on the switch", f"{flows}"),
    ]
    print(f"lark-controller capacity: real controller, OVS {BRIDGE} (userspace datapath), OpenFlow and API over TLS; "
          "simulated EPs in client processes on the same shared 2-vCPU machine; flows: "
          + ("label scheme ([labels] mode = vlan, an [ep.NAME] and a switch port per EP)" if LABELS else "per job"))
    for name, v in rows:
        print(f"{name:<64} {v:>22}")
    for e in errors[:5]:
        print(f"error: {e}")
    print(f"{'goal (issue 26)':<20} {'measured':>12} {'goal':>12}  verdict")
    for key, (op, limit) in GOALS.items():
        v = figures[key]
        met = v >= limit if op == ">=" else v <= limit
        print(f"{key:<20} {v:>12.1f} {op + ' ' + f'{limit:g}':>12}  {'met' if met else 'missed'}")
    print(" ".join(f"{k}={v:.1f}" if isinstance(v, float) else f"{k}={v}" for k, v in figures.items()))
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--client":
        sys.exit(client_main(sys.argv[2]))
    sys.exit(main())
