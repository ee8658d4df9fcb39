"""larkd: the root daemon that networks jobs on request from their wrapper."""
from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import fcntl
import logging
import os
import signal
import sys
import time

from .. import PROTOCOL_VERSION, __version__, protocol
from ..kernel import netns
from . import peercred
from ..kernel.accounting import Accountant
from ..policy.adsource import make_ad_source
from ..config import Config, load
from ..errors import LarkError
from ..kernel.firewall import make_firewall
from .jobnet import JobNetworker
from ..names import job_key
from ..plan import NetworkPlan
from ..policy.engine import decide
from .records import FinishedStore, RecordStore
from .reload import reload
from .sweep import sweep

log = logging.getLogger("larkd")
MAX_CONNECTIONS = 256
CHECK_REUSE_SECONDS = 120.0  # PREPARE_JOB runs seconds before the wrapper; longer means something else


class Larkd:
    def __init__(self, cfg: Config, config_path: str | None = None):
        self.cfg = cfg
        self.config_path = config_path  # None: HTCondor's configuration (what SIGHUP reads again)
        self.fw = make_firewall(cfg)
        self.records = RecordStore(cfg.records_dir)
        self.finished = FinishedStore(os.path.join(cfg.state_dir, "finished"), cfg.finished_keep)
        self.acct = Accountant(self.fw)
        self.net = JobNetworker(cfg, self.fw, self.records, self.acct, self.finished)
        self.ads = make_ad_source(cfg)
        self.netns_inode = netns.own_netns_inode()
        self.pool = concurrent.futures.ThreadPoolExecutor(cfg.setup_workers, thread_name_prefix="lark-setup")
        self.active: set[str] = set()          # keys with a live job or a setup in flight
        self.slot_locks: dict[str, asyncio.Lock] = {}
        self.watches: dict[str, int] = {}      # key -> pidfd of the starter
        self.checked: dict[str, tuple] = {}    # key -> (starter pid, start, when, plan) from PREPARE_JOB's check
        self.connections = 0
        self.tasks: set[asyncio.Task] = set()  # background releases: referenced until done, errors logged
        self.loop: asyncio.AbstractEventLoop | None = None

    # -- lifecycle ------------------------------------------------------------------------------------
    def prepare(self) -> None:
        cfg = self.cfg
        for d in (cfg.run_dir, cfg.state_dir):
            os.makedirs(d, mode=0o755, exist_ok=True)
        netns.ensure_netns_dir(cfg.netns_dir)
        if cfg.enable_ip_forward:
            with open("/proc/sys/net/ipv4/ip_forward", "w") as f:
                f.write("1")
            if cfg.subnet6:
                # NAT66 routes jobs' IPv6 too. Note: a host that forwards ignores router advertisements
                # unless its uplink has accept_ra = 2 (docs/admin.md).
                with open("/proc/sys/net/ipv6/conf/all/forwarding", "w") as f:
                    f.write("1")
        self.fw.ensure_base()

    def reconcile(self) -> list[tuple[str, int]]:
        """Adopt records whose starter still runs; tear down the rest and anything without a record.

        Runs in a worker thread (pyroute2's sync API cannot run inside the event loop); returns the
        (key, starter pid) pairs the loop must watch.
        """
        adopted = []
        for rec in self.records.all():
            if rec.phase == "ready" and peercred.alive(rec.starter_pid, rec.starter_start):
                self.active.add(rec.key)
                self.acct.start(rec.key, rec.created)
                adopted.append((rec.key, rec.starter_pid))
                log.info("adopted running job %s on %s", rec.job_id, rec.slot)
        actions = sweep(self.net, set(self.active))
        for a in actions:
            log.warning("reconcile removed %s", a)
        return adopted

    def watch(self, key: str, pid: int) -> None:
        assert self.loop is not None
        try:
            fd = os.pidfd_open(pid)
        except ProcessLookupError:
            self.loop.call_soon(self._starter_exited, key, None)
            return
        self.watches[key] = fd
        self.loop.add_reader(fd, self._starter_exited, key, fd)

    def _starter_exited(self, key: str, fd: int | None) -> None:
        if fd is not None:
            self.loop.remove_reader(fd)
            os.close(fd)
            self.watches.pop(key, None)
        self.spawn(self.release(key, "starter exited"), f"release of {key}")

    def spawn(self, coro, what: str) -> asyncio.Task:
        """A background task that is kept referenced until it ends (the loop holds only weak references) and
        whose failure is logged instead of vanishing with the task."""
        task = self.loop.create_task(coro)
        self.tasks.add(task)

        def done(t: asyncio.Task) -> None:
            self.tasks.discard(t)
            if not t.cancelled() and t.exception() is not None:
                log.error("%s failed: %s", what, t.exception())
        task.add_done_callback(done)
        return task

    async def release(self, key: str, reason: str) -> dict | None:
        async with self._lock(key):
            fd = self.watches.pop(key, None)
            if fd is not None:
                self.loop.remove_reader(fd)
                os.close(fd)
            try:
                return await self.loop.run_in_executor(self.pool, self.net.teardown, key, reason)
            finally:
                self.active.discard(key)

    def _lock(self, key: str) -> asyncio.Lock:
        return self.slot_locks.setdefault(key, asyncio.Lock())

    async def poller(self) -> None:
        while True:
            await asyncio.sleep(self.cfg.poll_interval)
            try:
                await self.loop.run_in_executor(self.pool, self.acct.poll)
            except Exception as e:  # a failed poll must not end polling
                log.error("counter poll failed: %s", e)
            try:
                await self.loop.run_in_executor(self.pool, self.net.renew_leases, set(self.active))
            except Exception as e:
                log.error("DHCP renewal pass failed: %s", e)

    # -- requests -------------------------------------------------------------------------------------
    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            if self.connections > MAX_CONNECTIONS:
                writer.write(protocol.error("larkd is busy: too many open connections; retry"))
                return
            sock = writer.get_extra_info("socket")
            who = peercred.peer_of(sock)
            try:
                line = await asyncio.wait_for(reader.readline(), self.cfg.request_timeout)
            except asyncio.TimeoutError:
                writer.write(protocol.error(f"request not received within {self.cfg.request_timeout} s"))
                return
            except (ValueError, asyncio.LimitOverrunError):
                writer.write(protocol.error(f"request larger than {self.cfg.max_request_bytes} bytes"))
                return
            if not line.endswith(b"\n"):
                writer.write(protocol.error("request must be one line ending in a newline"))
                return
            try:
                msg = protocol.parse_request(line)
                answer = await self.dispatch(msg, who)
            except LarkError as e:
                log.warning("refused %s from pid %d uid %d: %s", line[:40], who.pid, who.uid, e)
                answer = protocol.error(str(e))
            except Exception as e:
                log.exception("request from pid %d failed", who.pid)
                answer = protocol.error(f"internal error in larkd: {e}")
            writer.write(answer)
        except (ConnectionError, OSError):
            pass
        finally:
            self.connections -= 1
            try:
                await asyncio.wait_for(writer.drain(), 2)
                writer.close()
            except (ConnectionError, OSError, asyncio.TimeoutError):
                writer.transport.abort()

    async def dispatch(self, msg: dict, who: peercred.Peer) -> bytes:
        op = msg["op"]
        if op == "ping":
            return protocol.ok(version=__version__, protocol=PROTOCOL_VERSION, firewall=self.fw.name)
        if op == "setup":
            return await self.op_setup(who)
        if op == "check":
            return await self.op_check(who)
        if op in ("stats", "release"):
            starter = peercred.find_starter(who.pid, self.cfg.starter_paths)
            if starter is None and who.uid != 0:
                raise LarkError("only processes of a job (or root) may ask about a job",
                                obj=f"pid {who.pid} uid {who.uid}")
            if starter is not None:
                key = job_key(starter.slot)
            else:
                key = job_key(str(msg.get("slot", "")))
            if op == "release":
                summary = await self.release(key, "released on request")
                return protocol.ok(summary=summary)
            if msg.get("fresh") and key in self.active:
                await self.loop.run_in_executor(self.pool, self.acct.poll)
            return protocol.ok(**self.stats(key))
        if who.uid != 0:
            raise LarkError(f"operation {op} is for root only", obj=f"pid {who.pid} uid {who.uid}")
        if op == "status":
            return protocol.ok(jobs=[self.stats(k) for k in sorted(self.records.keys())])
        if op == "gc":
            dry = bool(msg.get("dry_run"))
            actions = await self.loop.run_in_executor(self.pool, sweep, self.net, set(self.active), dry)
            return protocol.ok(actions=actions, dry_run=dry)
        raise LarkError(f"operation {op} not handled", obj="protocol")

    def stats(self, key: str) -> dict:
        rec = self.records.load(key)
        if rec is None:
            last = self.finished.latest_for_key(key)
            return {"key": key, "active": False, "finished": last}
        return {"key": key, "active": True, "slot": rec.slot, "job_id": rec.job_id, "phase": rec.phase,
                "netns": rec.netns, "host_if": rec.host_if, "plan": rec.plan,
                "usage": self.acct.summary(key), "created": rec.created}

    async def op_setup(self, who: peercred.Peer) -> bytes:
        starter, job_ns = peercred.authorize_job(who, self.cfg.starter_paths, self.netns_inode)
        key = job_key(starter.slot)
        async with self._lock(key):
            rec = self.records.load(key)
            if rec is not None:
                same_starter = rec.starter_pid == starter.pid and rec.starter_start == starter.start
                if same_starter and rec.netns_inode == job_ns and rec.phase == "ready":
                    return protocol.ok(plan=rec.plan, env=env_for(rec.plan), reused=True)
                if same_starter:
                    raise LarkError("this slot's job already has a network in another namespace",
                                    job=rec.job_id, obj=f"slot {starter.slot}",
                                    fix="a job gets one network; do not create new network namespaces")
                await self.loop.run_in_executor(self.pool, self.net.teardown, key, "replaced by a new job")
            plan = self.checked_plan(starter, key)
            if plan is None:
                plan = await self.loop.run_in_executor(self.pool, self.plan_for, starter, key)
            self.active.add(key)
            try:
                t0 = time.perf_counter()
                rec = await self.loop.run_in_executor(self.pool, self.net.setup, plan, starter.pid, starter.start,
                                                      who.pid, job_ns)
            except Exception:
                self.active.discard(key)
                raise
            self.watch(key, starter.pid)
            log.info("networked job %s on %s: %s %s in %.1f ms", plan.job_id, plan.slot, rec.plan["network_type"],
                     rec.plan.get("ipv4") or "-", (time.perf_counter() - t0) * 1000)
            return protocol.ok(plan=rec.plan, env=env_for(rec.plan))

    async def op_check(self, who: peercred.Peer) -> bytes:
        """Decide the plan without building anything: the PREPARE_JOB hook's pre-flight, run before the job
        exists, so a policy error puts the job on hold instead of letting it start."""
        starter = peercred.find_starter(who.pid, self.cfg.starter_paths)
        if starter is None:
            raise LarkError("only a job's starter hooks may ask for a pre-flight check",
                            obj=f"pid {who.pid} uid {who.uid}")
        key = job_key(starter.slot)
        plan = await self.loop.run_in_executor(self.pool, self.plan_for, starter, key)
        # The setup that follows for this same starter reuses the decision instead of asking the startd and
        # the schedd again: those queries are the slowest part of a setup.
        self.checked[key] = (starter.pid, starter.start, time.monotonic(), plan.to_dict())
        return protocol.ok(plan=plan.to_dict())

    def checked_plan(self, starter: peercred.StarterInfo, key: str) -> NetworkPlan | None:
        """The pre-flight decision for this very starter (pid and start time), if recent; used once."""
        got = self.checked.pop(key, None)
        if got is None:
            return None
        pid, start, at, plan = got
        if (pid, start) != (starter.pid, starter.start) or time.monotonic() - at > CHECK_REUSE_SECONDS:
            return None
        return NetworkPlan.from_dict(plan)

    def plan_for(self, starter: peercred.StarterInfo, key: str):
        job_ad, machine_ad = self.ads.ads(starter)
        return decide(job_ad, machine_ad, self.cfg, starter.slot, key)

    def reload_config(self) -> None:
        """SIGHUP (condor_reconfig): apply the knobs that can change live; a bad configuration changes nothing."""
        try:
            reload(self.cfg, self.config_path)
        except LarkError as e:
            log.error("configuration not reloaded, the running one stays: %s", e)
        self.finished.keep = self.cfg.finished_keep

    # -- main -----------------------------------------------------------------------------------------
    async def serve(self) -> None:
        self.loop = asyncio.get_running_loop()
        for key, pid in await self.loop.run_in_executor(self.pool, self.reconcile):
            self.watch(key, pid)
        path = self.cfg.socket
        os.makedirs(os.path.dirname(path), mode=0o755, exist_ok=True)
        if os.path.exists(path):
            os.unlink(path)
        server = await asyncio.start_unix_server(self.handle, path=path, limit=self.cfg.max_request_bytes)
        # Any job user must be able to connect; every request is authorised from SO_PEERCRED instead.
        os.chmod(path, 0o666)
        stop = asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGQUIT):  # condor_master stops daemons with SIGQUIT
            self.loop.add_signal_handler(sig, stop.set)
        self.loop.add_signal_handler(signal.SIGHUP, self.reload_config)
        poll = self.spawn(self.poller(), "counter polling")
        log.info("larkd %s listening on %s (firewall %s, subnet %s, uplink %s)", __version__, path, self.fw.name,
                 self.cfg.subnet, self.cfg.uplink)
        await stop.wait()
        # Jobs keep their networks when larkd stops: a restart adopts them from their records.
        log.info("larkd stopping; %d job networks stay up and will be adopted at the next start",
                 len(self.active))
        poll.cancel()
        server.close()
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass


def env_for(plan: dict) -> dict:
    env = {"LARK_NETWORK_TYPE": plan.get("network_type", "")}
    if plan.get("ipv4"):
        env["LARK_IPV4_ADDRESS"] = plan["ipv4"]
        env["LARK_GATEWAY"] = plan.get("gateway4") or ""
    if plan.get("ipv6"):
        env["LARK_IPV6_ADDRESS"] = plan["ipv6"]
        env["LARK_GATEWAY6"] = plan.get("gateway6") or ""
    if plan.get("inbound_port"):
        env["LARK_INBOUND_PORT"] = str(plan["inbound_port"])
    return env


def hold_daemon_lock(cfg: Config) -> int:
    os.makedirs(cfg.run_dir, mode=0o755, exist_ok=True)
    fd = os.open(cfg.lock_path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        raise LarkError("another larkd (or `lark gc`) holds the lock", obj=cfg.lock_path,
                        fix="stop the other instance first") from None
    return fd


def log_to_file(path: str) -> None:
    """Under condor_master larkd's stderr goes nowhere: log where HTCondor daemons log (LARK_LOG_FILE)."""
    import logging.handlers
    os.makedirs(os.path.dirname(path), exist_ok=True)
    handler = logging.handlers.WatchedFileHandler(path)  # reopens after logrotate moves the file
    handler.setFormatter(logging.getLogger().handlers[0].formatter)
    root = logging.getLogger()
    for h in list(root.handlers):
        root.removeHandler(h)
    root.addHandler(handler)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="larkd", description="Lark per-job network daemon")
    ap.add_argument("--config", help="a TOML config file instead of the LARK_* knobs of HTCondor's configuration "
                    "(deprecated; for tests, or $LARK_CONFIG)")
    ap.add_argument("--log-level", default="INFO")
    args = ap.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s larkd[%(process)d] %(levelname)s %(message)s")
    logging.getLogger("pyroute2").setLevel(logging.WARNING)
    if os.geteuid() != 0:
        log.error("larkd must run as root (it creates network devices and firewall rules)")
        return 2
    try:
        cfg = load(args.config)
        if cfg.log_file:
            log_to_file(cfg.log_file)
        lock = hold_daemon_lock(cfg)
        d = Larkd(cfg, config_path=args.config or os.environ.get("LARK_CONFIG"))
        d.prepare()
        asyncio.run(d.serve())
    except LarkError as e:
        log.error("%s", e)
        return 1
    os.close(lock)
    return 0


if __name__ == "__main__":
    sys.exit(main())
