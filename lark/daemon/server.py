"""larkd: the root daemon that networks jobs on request from their wrapper."""
from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import contextlib
import fcntl
import logging
import os
import signal
import sys
import time
from collections.abc import Callable
from typing import Any

from .. import PROTOCOL_VERSION, __version__, protocol
from ..config import Config, load
from ..errors import LarkError
from ..kernel import forwarding, netns
from ..kernel.accounting import Accountant
from ..kernel.firewall import make_firewall
from ..kernel.sections import ForwardingSection
from ..names import job_key
from ..plan import NetworkPlan
from ..policy.adsource import make_ad_source
from ..policy.containers import check_container_network
from ..policy.engine import decide, job_id_of
from ..policy.startd import JobIdentity
from . import docker_setup, peercred, ssh_session, transfer_plugin
from .admission import Admission, LogLimit, RateLimit
from .adpush import ROUTINE, URGENT, AdPusher, PushQueue
from .heaptrim import HeapTrim
from .jobnet import TRANSFER_NETNS, JobNetworker
from .metrics import machine_mbit, make_metrics, node_totals
from .pins import Pin, PinStore, merge_usage
from .records import FinishedStore, JobRecord, RecordStore
from .reload import reload
from .sandbox_service import SandboxService
from .slotjob import Check, Pushed, PushRequest, SlotJobs
from .sweep import sweep
from .verify import report, verify_job

log = logging.getLogger("larkd")
LISTEN_BACKLOG = 1024
EARLY_REPUSH_S = 5.0   # a running job's second push to its schedd comes this soon after its first
JOB_PUSH_MIN_S = 30.0  # a job's own `push` requests (other than its one exit barrier) reach its schedd this rarely
CHECK_REUSE_SECONDS = 120.0  # PREPARE_JOB runs seconds before the wrapper; longer means something else


def tag_failure(e: BaseException, reason: str, held: bool | None = None) -> None:
    """Mark an exception on its way out of a request with its lark_failures reason, and whether larkd held the job
    at its schedd: any exception type may carry them; the request handler reads them back with getattr."""
    tagged: Any = e   # arbitrary attributes on an exception of any type
    tagged.metric_reason = reason
    if held is not None:
        tagged.held = held


class Larkd:
    loop: asyncio.AbstractEventLoop   # the running event loop, from run() on
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
        self.userns_inode = peercred.own_userns_inode()
        self.pins = PinStore(os.path.join(cfg.run_dir, "pins"))
        self.pool = concurrent.futures.ThreadPoolExecutor(cfg.setup_workers, thread_name_prefix="lark-setup")
        # Edits at the schedd wait on the network and the schedd: never in the setup workers, where a slow
        # schedd would hold up the next jobs' setups. One thread, most urgent first: a job's exit barrier goes
        # before the periodic pushes, and a push reads its counters when it runs, so none lands older figures.
        self.push_pool = PushQueue()
        self.active: set[str] = set()          # keys with a live job or a setup in flight
        # key -> the slot's job in memory: its lock, starter watch, ssh sessions' netns, PREPARE_JOB check, push
        # state, exit barrier (slotjob.py); its record and pin stay on disk (records.py, pins.py)
        self.jobs = SlotJobs()
        self.connections = 0
        self.tasks: set[asyncio.Task] = set()  # background releases: referenced until done, errors logged
        self.admission = Admission(cfg.max_connections_per_uid, cfg.max_connections_per_starter,
                                   cfg.max_connections_shared)
        self.check_limit = RateLimit(cfg.check_min_interval)  # each check queries the startd and the schedd
        self.pusher = (AdPusher(cfg.schedd_push_retry, between=self.push_pool.run_urgent)
                       if cfg.ad_source == "startd" and cfg.schedd_push_interval > 0 else None)
        self.log_limit = LogLimit()
        # (starter pid, start) -> the job's identity from its claim (policy/startd.py): where its figures go
        self.identities: dict[tuple[int, int], JobIdentity] = {}
        # pools are fixed at start
        self.metrics = make_metrics(cfg.metrics_address, self.records, self.acct, self.net.pools)
        self.heap = HeapTrim()
        self.uplink_mbit: float | None = None
        self.sandbox = SandboxService(cfg, self.netns_inode, lambda: self.ads, self.pool, self.spawn)

    # -- lifecycle ------------------------------------------------------------------------------------
    def prepare(self) -> None:
        cfg = self.cfg
        for d in (cfg.run_dir, cfg.state_dir):
            os.makedirs(d, mode=0o755, exist_ok=True)
        netns.ensure_netns_dir(cfg.netns_dir)
        # Before forwarding goes on: whether Lark is the one turning it on.
        forwarding.claim(ForwardingSection.from_config(cfg))
        if cfg.enable_ip_forward:
            with open("/proc/sys/net/ipv4/ip_forward", "w") as f:
                f.write("1")
            if cfg.subnet6:
                # NAT66 routes jobs' IPv6 too. Note: a host that forwards ignores router advertisements
                # unless its uplink has accept_ra = 2 (docs/admin.md).
                with open("/proc/sys/net/ipv6/conf/all/forwarding", "w") as f:
                    f.write("1")
        self.fw.ensure_base()
        if self.pusher is not None and self.pusher.worker is not None:
            self.pusher.worker.start()  # htcondor2 imported now, not during the first job's exit barrier
        self.uplink_mbit = machine_mbit(cfg)
        if cfg.metrics_address:
            self.metrics.serve(cfg.metrics_address)

    def reconcile(self) -> list[tuple[str, int, int]]:
        """Adopt records whose starter still runs; tear down the rest and anything without a record.

        Runs in a worker thread (pyroute2's sync API cannot run inside the event loop); returns the
        (key, starter pid, starter start time) triples the loop must watch.
        """
        adopted = []
        for rec in self.records.all():
            if rec.phase == "ready" and peercred.alive(rec.starter_pid, rec.starter_start):
                self.active.add(rec.key)
                self.acct.start(rec.key, rec.created)
                self.net.resume_fireflies(rec)
                adopted.append((rec.key, rec.starter_pid, rec.starter_start))
                log.info("adopted running job %s on %s", rec.job_id, rec.slot)
        for pin in self.pins.all():
            if pin.key in self.active:
                continue
            if peercred.alive(pin.starter_pid, pin.starter_start):
                # The job's network was released (or its setup failed) but it still runs: keep it pinned and
                # watch its starter, so the pin goes when the job ends.
                adopted.append((pin.key, pin.starter_pid, pin.starter_start))
            else:
                # Its job ended while larkd was down: the final figures include what it moved before.
                summary = self.net.teardown(pin.key, "orphaned", carried=pin.carried)
                self._push_final(pin, summary)
                self.pins.drop(pin.key)
        actions = sweep(self.net, set(self.active), sandbox=self.sandbox.limiter)
        for a in actions:
            log.warning("reconcile removed %s", a)
        return adopted

    def watch(self, key: str, pid: int, start: int) -> None:
        fd = peercred.pidfd_of_live(pid, start)
        if fd is None:   # the starter ended already
            self.loop.call_soon(self._starter_exited, key, None, (pid, start))
            return
        self.jobs.get(key).watch = fd
        self.loop.add_reader(fd, self._starter_exited, key, fd, (pid, start))

    def _starter_exited(self, key: str, fd: int | None, starter: tuple[int, int] | None = None) -> None:
        if fd is not None:
            self.loop.remove_reader(fd)
            os.close(fd)
            job = self.jobs.peek(key)
            if job is not None and job.watch == fd:
                job.watch = None
        self.spawn(self.release(key, "starter exited", final=True, starter=starter), f"release of {key}")

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

    async def release(self, key: str, reason: str, final: bool = True,
                      starter: tuple[int, int] | None = None) -> dict | None:
        """Tear down a job's network. `final`: the job ended (its figures become a finished record and its
        pin goes); else its starter still runs, so it stays pinned and watched and its figures are carried.
        `starter`: act only if the slot still belongs to this starter (its exit may be noticed after the
        slot's next job was networked)."""
        async with self._lock(key):
            return await self._release(key, reason, final, starter)

    async def _release(self, key: str, reason: str, final: bool = True,
                       starter: tuple[int, int] | None = None) -> dict | None:
        """`release` with the slot's lock held."""
        pin = self._pin(key)
        if starter is not None and pin is not None and not pin.same_starter(*starter):
            return None
        # The job ends: its in-memory state goes here, in one place (the starter's watch first); its pin below.
        ended = self.jobs.end(key, self.loop, (pin.starter_pid, pin.starter_start) if pin else None) if final else None
        had_network = self.records.load(key) is not None
        t0 = time.perf_counter()
        try:
            summary = await self.loop.run_in_executor(self.pool, self.net.teardown, key, reason,
                                                      pin.carried if pin else None, final)
            self.metrics.observe_teardown(time.perf_counter() - t0)
            self.heap.changed()
        except Exception:
            self.metrics.failed("teardown")
            raise
        finally:
            self.active.discard(key)
            if ended is not None and ended.session_netns is not None:
                await self._kill_session_leftovers(key, ended.session_netns)
        if pin is not None:
            if final:
                if not had_network and pin.carried and pin.job_id:
                    # Its network was released earlier and not set up again: the carried figures are
                    # all it moved, and still its one finished record.
                    summary = self.finished.finish(key, pin.carried, reason, job_id=pin.job_id,
                                                   started=pin.first_setup)
                await self.loop.run_in_executor(self.push_pool, self._push_final, pin, summary)
                self.pins.drop(key)
            elif summary is not None:
                pin.carried = summary
                self.pins.save(pin)
        return summary

    async def _kill_session_leftovers(self, key: str, session_ns: int) -> None:
        killed = await self.loop.run_in_executor(self.pool, ssh_session.kill_leftovers, session_ns)
        if killed:
            log.warning("job on %s ended: killed %d process(es) its ssh sessions left in its network "
                        "namespace: %s", key, len(killed), killed)

    def _push_final(self, pin: Pin, summary: dict | None) -> None:
        if self.pusher is not None and summary is not None and pin.schedd:
            self.pusher.push_final(pin.key, pin.schedd, pin.job_id, summary)

    def push_running(self) -> None:
        """Running jobs' figures into their ads at their schedds (worker thread): a job's first push comes with
        the first poll after its setup (so even a short job whose end larkd misses has figures in its history),
        then one every schedd_push_interval. Then the due retries of final pushes."""
        if self.pusher is None:   # no pushes to schedds configured (the poller does not call this then)
            return
        now = time.monotonic()
        for key in sorted(self.active):
            pin = self._pin(key)
            if pin is None or not pin.schedd:
                continue
            job = self.jobs.get(key)
            pushed = job.pushed
            last, pushes = (pushed.at, pushed.pushes) if pushed is not None else (None, 0)
            if pushed is not None and pushed.job_id != pin.job_id:  # the slot's next job, before its end was seen
                last, pushes = None, 0
            # The first push with the first poll, a second one EARLY_REPUSH_S later (a short job's figures after
            # its first seconds, in case larkd is not there at its end), then every schedd_push_interval; a
            # failed push is tried again at the next poll.
            wait = EARLY_REPUSH_S if pushes == 1 else self.cfg.schedd_push_interval
            if last is not None and now - last < wait:
                continue
            self.push_pool.run_urgent()  # a barrier asked meanwhile waits for one job's push, not the round
            if self.pusher.push(key, pin.schedd, pin.job_id, self.stats(key)):
                job.pushed = Pushed(pin.job_id, now, pushes + 1)
        for job in self.jobs:
            if job.key not in self.active:
                job.pushed = None
        self.pusher.retry_pending()

    def _pin(self, key: str) -> Pin | None:
        try:
            return self.pins.load(key)
        except LarkError as e:
            log.error("%s", e)
            return None

    def _lock(self, key: str) -> asyncio.Lock:
        return self.jobs.get(key).lock

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
            if self.pusher is not None:
                try:
                    await self.loop.run_in_executor(self.push_pool, self.push_running)
                except Exception as e:
                    log.error("pushing figures to the schedd failed: %s", e)
            if self.heap.due():
                await self.loop.run_in_executor(self.pool, self.heap.run)

    # -- requests -------------------------------------------------------------------------------------
    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        opened: list[peercred.Peer] = []
        admitted: list[str] = []
        try:
            sock = writer.get_extra_info("socket")
            who = peercred.peer_of(sock)
            opened.append(who)
            bucket = self.admission.bucket(who.uid, self._starter_pid(who))
            if not self.admission.admit(bucket):
                writer.write(protocol.error(f"larkd is busy: too many open connections from {bucket}; retry",
                                            busy=True))
                return
            admitted.append(bucket)
            try:
                # asyncio.timeout, not wait_for: 3.11's wait_for wraps the read in a Task of its own, one more loop
                # pass per request (36 us against 6-11 us when the line is already there, as it is for a wrapper)
                async with asyncio.timeout(self.cfg.request_timeout):
                    line = await reader.readline()
            except TimeoutError:
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
                answer = await self.dispatch(msg, who, reader, writer)
            except LarkError as e:
                self._log_refusal(who, "refused %s from pid %d uid %d: %s", line[:40], who.pid, who.uid, e)
                self.metrics.failed(getattr(e, "metric_reason", "refused"))
                answer = protocol.error(str(e), **({"held": True} if getattr(e, "held", False) else {}))
            except Exception as e:
                if self.log_limit.allow(who.uid)[0]:  # a bug's traceback, but not one per request of a loop
                    log.exception("request from pid %d uid %d failed", who.pid, who.uid)
                self.metrics.failed(getattr(e, "metric_reason", "internal"))
                answer = protocol.error(f"internal error in larkd: {e}",
                                        **({"held": True} if getattr(e, "held", False) else {}))
            writer.write(answer)
        except (ConnectionError, OSError):
            pass
        finally:
            self.connections -= 1
            for peer in opened:
                peer.close()
            for bucket in admitted:
                self.admission.release(bucket)
            try:
                async with asyncio.timeout(2):
                    await writer.drain()
                writer.close()
            except (TimeoutError, ConnectionError, OSError):
                writer.transport.abort()

    def _log_refusal(self, who: peercred.Peer, fmt: str, *args) -> bool:
        """A warning about a request, unless this uid already had its share of the log this minute."""
        ok, suppressed = self.log_limit.allow(who.uid)
        if ok:
            if suppressed:
                fmt += f" ({suppressed} more from uid {who.uid} not logged)"
            log.warning(fmt, *args)
        return ok

    def _starter_pid(self, who: peercred.Peer) -> int | None:
        """The starter a connecting process descends from (its connection bucket), if any."""
        if who.uid == 0:
            return None
        try:
            starter = peercred.starter_of(who, self.cfg.starter_paths)   # not another job's bucket by pid reuse
        except (LarkError, OSError, ValueError):
            return None
        return starter.pid if starter else None

    async def dispatch(self, msg: dict, who: peercred.Peer, reader: asyncio.StreamReader | None = None,
                       writer: asyncio.StreamWriter | None = None) -> bytes:
        op = msg["op"]
        if op == "ping":
            return protocol.ok(version=__version__, protocol=PROTOCOL_VERSION, firewall=self.fw.name)
        if op == "setup":
            return await self.op_setup(who)
        if op == "check":
            return await self.op_check(who)
        if op == "release":
            # A job that could release its network could ask again from a namespace it made, or restart its
            # counters; its network lasts as long as its starter. Root (and the root starter) only.
            if who.uid != 0:
                raise LarkError("release is for root only: a job's network lasts until its starter exits",
                                obj=f"pid {who.pid} uid {who.uid}",
                                fix="end the job; larkd tears its network down when the starter exits")
            peercred.still_same_process(who)
            key = job_key(str(msg.get("slot", "")))
            pin = self._pin(key)
            running = pin is not None and peercred.alive(pin.starter_pid, pin.starter_start)
            summary = await self.release(key, "released on request", final=not running)
            return protocol.ok(summary=summary)
        if op == "stats":
            starter = peercred.starter_of(who, self.cfg.starter_paths)
            if starter is None and who.uid != 0:
                raise LarkError("only processes of a job (or root) may ask about a job",
                                obj=f"pid {who.pid} uid {who.uid}")
            key = job_key(starter.slot) if starter is not None else job_key(str(msg.get("slot", "")))
            return protocol.ok(**self.stats(key))
        if op == "push":
            return await self.op_push(who, barrier=msg.get("barrier") is True)
        if op == "ssh_session" and reader is not None and writer is not None:
            return await self.op_ssh_session(who, msg.get("argv"), reader, writer)
        if op == "docker_setup":
            return await self.op_docker_setup(who, msg.get("container"), msg.get("pid"))
        if op == "transfer_plugin" and reader is not None and writer is not None:
            return await self.op_transfer_plugin(who, msg.get("argv"), msg.get("request"), reader, writer)
        if op == "totals":
            # Anyone may ask (the startd's cron runs as the condor user): node-wide sums only, no job named.
            return protocol.ok(**node_totals(self.records, self.acct, self.uplink_mbit))
        if who.uid != 0:
            raise LarkError(f"operation {op} is for root only", obj=f"pid {who.pid} uid {who.uid}",
                            fix="root's own tools ask it (the lark command run as root, lark-starter as the "
                                "startd starts it); a job's processes never may")
        if op == "status":
            return protocol.ok(jobs=[self.stats(k) for k in sorted(self.records.keys())])
        if op == "gc":
            dry = bool(msg.get("dry_run"))
            actions = await self.loop.run_in_executor(self.pool, sweep, self.net, set(self.active), dry, None,
                                                      self.sandbox.limiter)
            return protocol.ok(actions=actions, dry_run=dry)
        if op == "verify":
            return protocol.ok(**await self.op_verify())
        if op == "sandbox_limit":
            return await self.sandbox.op_limit(who, msg.get("slot"), msg.get("argv"))
        raise LarkError(f"operation {op} not handled", obj="protocol")

    async def op_ssh_session(self, who: peercred.Peer, argv: object, reader: asyncio.StreamReader,
                             writer: asyncio.StreamWriter) -> bytes:
        """condor_ssh_to_job's sshd, asked for by its wrapper, run in the job's own namespace (ssh_session.py).
        Two answers: `started` once the sshd runs (the wrapper then lets go of its copies of the session's
        descriptors), then its `exit_code`. The connection stays open for the session; closing it ends the sshd."""
        command = ssh_session.session_command(argv)
        if who.uid == 0:
            raise LarkError("ssh_session runs sessions as the job's user, not root", obj=f"pid {who.pid}",
                            fix="only condor_ssh_to_job's sshd, started by the starter as the job's user, asks")
        starter = peercred.starter_of(who, self.cfg.starter_paths)
        if starter is None:
            raise LarkError("only a process of a job may open a session in its network", obj=f"pid {who.pid} "
                            f"uid {who.uid}", fix="use condor_ssh_to_job")
        key = job_key(starter.slot)
        rec = self.records.load(key)
        if rec is None or rec.phase != "ready" or (rec.starter_pid, rec.starter_start) != (starter.pid,
                                                                                            starter.start):
            raise LarkError("this slot's job has no network (yet)", obj=f"slot {starter.slot}",
                            fix="the session runs without a network; retry once the job runs")
        path = self.net.netns_path(key)
        if os.stat(path).st_ino != rec.netns_inode:
            raise LarkError("the job's network namespace is no longer the one larkd built", job=rec.job_id,
                            obj=path, fix="lark status --verify; the job's network has drifted")
        self.jobs.get(key).session_netns = rec.netns_inode   # its leftovers go when the job ends (release)
        code = await ssh_session.run_as_asker(who, rec.job_id, path, command.program(self.cfg.ssh_sshd),
                                        "ssh session", reader, writer)
        return protocol.ok(exit_code=code)

    async def op_transfer_plugin(self, who: peercred.Peer, argv: object, request: object,
                                 reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bytes:
        """A file-transfer plugin, asked for by its wrapper (lark-transfer-plugin), run in the job's network
        (transfer_plugin.py). Before the job's program starts (input transfer) the job has no namespace yet:
        larkd builds the job's network, as its policy decides, in a namespace of its own making, which
        `op_setup` later replaces by the job's own (carrying what the plugins moved). After the job's program
        (output transfer), the job's own namespace, kept named until the starter exits. An upload's bytes are
        pushed into the job's ad before the answer, while the job is still in the queue. A refusal carries the
        plugin's result (every file failed with the reason), which the wrapper hands to HTCondor."""
        try:
            command, rec = await self._transfer_plugin_network(who, argv)
        except LarkError as e:
            self._log_refusal(who, "refused a transfer plugin of pid %d uid %d: %s", who.pid, who.uid, e)
            self.metrics.failed(getattr(e, "metric_reason", "refused"))
            return protocol.error(str(e), results=transfer_plugin.failure_ads(
                request, f"Lark: this transfer gets no network: {' '.join(str(e).split())}"))
        key = job_key(rec.slot)
        code = await ssh_session.run_as_asker(who, rec.job_id, self.net.netns_path(key), command.argv(),
                                        "transfer plugin", reader, writer)
        if command.upload:
            await self._push_now(key)
        return protocol.ok(exit_code=code)

    async def _transfer_plugin_network(self, who: peercred.Peer,
                                       argv: object) -> tuple[transfer_plugin.PluginCommand, JobRecord]:
        """The checked plugin command and the job's network it runs in."""
        command = transfer_plugin.plugin_command(argv, self.cfg.transfer_plugin_dir)
        if who.uid == 0:
            raise LarkError("transfer plugins run as the job's user, not root", obj=f"pid {who.pid}",
                            fix="unset RUN_FILETRANSFER_PLUGINS_WITH_ROOT")
        starter = peercred.starter_of(who, self.cfg.starter_paths)
        if starter is None:
            raise LarkError("only a job's starter runs transfer plugins in the job's network",
                            obj=f"pid {who.pid} uid {who.uid}", fix="name lark-transfer-plugin in FILETRANSFER_PLUGINS")
        key = job_key(starter.slot)
        async with self._lock(key):
            return command, await self._transfer_network(starter, key)

    async def _transfer_network(self, starter: peercred.StarterInfo, key: str) -> JobRecord:
        """The slot lock held: the job's network a plugin of this starter's job runs in, built now if the job
        has none yet."""
        rec = self.records.load(key)
        if rec is not None and (rec.starter_pid, rec.starter_start) == (starter.pid, starter.start):
            if rec.phase != "ready":
                raise LarkError("the job's network is not ready", job=rec.job_id, obj=f"slot {starter.slot}",
                                fix="retry; lark status --verify")
            if os.stat(self.net.netns_path(key)).st_ino != rec.netns_inode:
                raise LarkError("the job's network namespace is no longer the one larkd built", job=rec.job_id,
                                obj=self.net.netns_path(key), fix="lark status --verify; the network has drifted")
            return rec
        pin = self._pin(key)
        if pin is not None and pin.same_starter(starter.pid, starter.start) and pin.netns_inode:
            raise LarkError("the job's network was released while it runs: its transfers get none", job=pin.job_id,
                            obj=f"slot {starter.slot}", fix="none: a released job stays without a network")
        if rec is not None:    # the slot's previous job, whose starter's exit is not handled yet
            await self.loop.run_in_executor(self.pool, self.net.teardown, key, "replaced by a new job")
        plan = await self.decide_plan(starter, key)
        if not plan.has_network:
            raise LarkError(f"the job's policy gives it no network (network type {plan.network_type}), so its "
                            "file transfers by URL have none either", job=plan.job_id, obj=f"slot {starter.slot}",
                            fix="move the files through the sandbox (transfer_input_files of local files), or "
                                "ask for a network in the submit file")
        return await self._network(starter, key, plan, TRANSFER_NETNS, TRANSFER_NETNS, "for its file transfers")

    async def _network(self, starter: peercred.StarterInfo, key: str, plan: NetworkPlan, job_pid: int,
                       job_ns: int, what: str = "") -> JobRecord:
        """The slot lock held: pin the job (with its claim's schedd), build its network (`job_pid` 0: in a
        namespace larkd makes, for its transfers), watch its starter. A failed build leaves the slot inactive;
        a job whose own setup failed is held at its schedd."""
        pin = self.pin(starter, key, job_ns)
        pin.job_id = plan.job_id
        identity = self.identities.pop((starter.pid, starter.start), None)
        if identity is not None:   # the claim's schedd, checked against the job ad (plan.job_id is its JobId)
            pin.schedd, pin.global_job_id = identity.schedd, identity.global_job_id
        self.pins.save(pin)
        self.active.add(key)
        try:
            t0 = time.perf_counter()
            built = await self.loop.run_in_executor(self.pool, self.net.setup, plan, starter.pid, starter.start,
                                                    job_pid, job_ns)
        except Exception as e:
            self.active.discard(key)
            held = None if job_pid == TRANSFER_NETNS else await self.hold_unnetworked(pin, e)
            tag_failure(e, "setup", held=held)   # a transfer's refusal holds the job through HTCondor instead
            raise
        self.metrics.observe_setup(plan.network_type, time.perf_counter() - t0)
        self.heap.changed()
        if self.jobs.get(key).watch is None:
            self.watch(key, starter.pid, starter.start)
        log.info("networked job %s on %s%s: %s %s in %.1f ms", plan.job_id, plan.slot, f" {what}" if what else "",
                 built.plan["network_type"], built.plan.get("ipv4") or "-", (time.perf_counter() - t0) * 1000)
        return built

    async def _push_now(self, key: str) -> None:
        """The job's figures into its ad now (an output plugin's bytes, before the job leaves the queue). Within
        the job's push budget: a job can run the plugin itself with -upload, as often as it likes."""
        pin = self._pin(key)
        if self.pusher is None or pin is None or not pin.schedd or self._push_budget_wait(key, pin,
                                                                                         time.monotonic()):
            return
        if key in self.active:
            await self.loop.run_in_executor(self.pool, self.acct.poll)
        await asyncio.wrap_future(self.push_pool.submit_at(URGENT, lambda: self._push_job(key, pin)))

    async def op_verify(self) -> dict:
        """`lark status --verify`: every ready job's kernel objects against its record, read-only; each slot under
        its lock, so no setup or teardown of that slot runs while its objects are read."""
        checks = []
        for key in sorted(self.records.keys()):
            async with self._lock(key):
                checks.append(await self.loop.run_in_executor(self.pool, verify_job, self.net, key))
        return report(checks)

    async def op_push(self, who: peercred.Peer, barrier: bool = False) -> bytes:
        """The exit barrier: the job's wrapper, once the job's program has ended, asks larkd to read the job's
        counters now and write its figures into its ad at its schedd itself (as root), then answers; the
        starter waits for the wrapper, so the job is still in the queue and its history gets these figures. The
        wrapper only asks: it carries no figure, so a job that tampers with it can at most skip the barrier
        (the periodic and the final push still happen).

        The first barrier of a job is served at once and ahead of routine pushes (PushQueue). Every other
        request, a job's own `push` or a second barrier, has a budget of one per JOB_PUSH_MIN_S per job: past it
        the answer is a refusal that costs no counter poll and no schedd edit (issue 23 item 10)."""
        t_in = time.perf_counter()
        starter = peercred.starter_of(who, self.cfg.starter_paths)
        if starter is None:
            raise LarkError("only a job's own processes may ask larkd to push its figures",
                            obj=f"pid {who.pid} uid {who.uid}",
                            fix="run jobs through lark-job-wrapper (condor_config.d/50-lark.conf)")
        key = job_key(starter.slot)
        pin = self._pin(key)
        if self.pusher is None or pin is None or not pin.schedd:
            return protocol.ok(pushed=False, reason="no schedd push for this job (ad_source or push interval)")
        now = time.monotonic()
        job = self.jobs.get(key)
        first_barrier = barrier and job.barrier != pin.job_id
        if first_barrier:
            job.barrier = pin.job_id
        else:
            wait = self._push_budget_wait(key, pin, now)
            if wait:
                return protocol.ok(pushed=False, refused=True, retry_after=round(wait, 1), reason=(
                    f"job {pin.job_id}: push refused, a job may ask for it once every {JOB_PUSH_MIN_S:g} s "
                    f"(next in {wait:.0f} s); larkd pushes the job's figures every schedd_push_interval and at "
                    "its end without being asked"))
        pushes = job.pushed.pushes if job.pushed is not None and job.pushed.job_id == pin.job_id else 0
        t0 = time.perf_counter()
        if key in self.active:
            await self.loop.run_in_executor(self.pool, self.acct.poll)
        t_read = time.perf_counter()
        ran: list[float] = []

        def push_now() -> bool:
            ran.append(time.perf_counter())
            return self._push_job(key, pin)
        ok = await asyncio.wrap_future(self.push_pool.submit_at(URGENT if first_barrier else ROUTINE, push_now))
        if ok:
            self.jobs.get(key).pushed = Pushed(pin.job_id, now, pushes + 1)
        if first_barrier:  # what the job waits for at its end (bench/pool_true_jobs.py reads this line)
            t_end = time.perf_counter()
            t_ran = ran[0] if ran else t_end
            log.info("exit barrier of job %s: %s in %.1f ms (peer %.1f ms, counters %.1f ms, push thread busy "
                     "%.1f ms, schedd %.1f ms)", pin.job_id, "pushed" if ok else "not pushed",
                     (t_end - t_in) * 1000, (t0 - t_in) * 1000, (t_read - t0) * 1000, (t_ran - t_read) * 1000,
                     (t_end - t_ran) * 1000)
        return protocol.ok(pushed=ok)

    def _push_budget_wait(self, key: str, pin: Pin, now: float) -> float:
        """A push a job asked for (its own `push`, a second barrier, an upload by its plugin) is within its budget
        of one per JOB_PUSH_MIN_S: 0.0, and the budget is spent; else the seconds until the next one."""
        job = self.jobs.get(key)
        asked = job.push_request
        if asked is not None and asked.job_id == pin.job_id and now - asked.at < JOB_PUSH_MIN_S:
            return JOB_PUSH_MIN_S - (now - asked.at)
        job.push_request = PushRequest(pin.job_id, now)
        return 0.0

    def _push_job(self, key: str, pin: Pin) -> bool:
        """One job's figures to its schedd (push thread), its counters read now: a push that waited in the queue
        carries what the job moved until it ran."""
        assert self.pusher is not None
        return self.pusher.push(key, pin.schedd, pin.job_id, self.stats(key))

    def stats(self, key: str) -> dict:
        rec = self.records.load(key)
        pin = self._pin(key)
        carried = pin.carried if pin else None
        if rec is None:
            if carried:  # released while its job still runs: what it moved so far
                return {"key": key, "active": False, "usage": carried}
            last = self.finished.latest_for_key(key)
            return {"key": key, "active": False, "finished": last}
        return {"key": key, "active": True, "slot": rec.slot, "job_id": rec.job_id, "phase": rec.phase,
                "netns": rec.netns, "host_if": rec.host_if, "plan": rec.current_plan(),
                "usage": merge_usage(carried, self.acct.summary(key)), "created": rec.created}

    async def op_setup(self, who: peercred.Peer) -> bytes:
        starter, job_ns = peercred.authorize_job(who, self.cfg.starter_paths, self.netns_inode, self.userns_inode)
        return await self._setup_job(starter, who.pid, job_ns)

    async def op_docker_setup(self, who: peercred.Peer, container: object, pid: object) -> bytes:
        """A docker-universe job's network, asked for by lark-oci-runtime (root, under containerd) after `runc
        create` and before `start`: built in the container's own network namespace, its init's pid as the job's
        (docker_setup.py checks which job it is); torn down, as a vanilla job's, when its starter exits."""
        cfg = self.cfg
        job = await self.loop.run_in_executor(self.pool, docker_setup.authorize, who, container, pid,
                                              cfg.docker_host, cfg.starter_paths, self.netns_inode,
                                              self.userns_inode)
        return await self._setup_job(job.starter, job.pid, job.netns,
                                     check=lambda plan: docker_setup.check_job_ad(plan.job_id, job))

    async def _setup_job(self, starter: peercred.StarterInfo, job_pid: int, job_ns: int,
                         check: Callable[[NetworkPlan], None] | None = None) -> bytes:
        """The job's network in its namespace `job_ns` (of process `job_pid`), under its slot's lock; `check`
        refuses a plan that is not this job's."""
        key = job_key(starter.slot)
        async with self._lock(key):
            old_pin = self._pin(key)
            self.pin(starter, key, job_ns)
            rec = self.records.load(key)
            if rec is not None:
                same_starter = rec.starter_pid == starter.pid and rec.starter_start == starter.start
                if same_starter and rec.netns_inode == job_ns and rec.phase == "ready":
                    return protocol.ok(plan=rec.current_plan(), env=env_for(rec.plan), reused=True,
                                       exit_barrier=self.exit_barrier())
                if same_starter and rec.job_pid == TRANSFER_NETNS:
                    # The input transfer's network (op_transfer_plugin): the job's own replaces it, and what the
                    # plugins moved is carried into the job's figures.
                    await self._release(key, "input transfer done", final=False)
                    rec = None
            if rec is not None:
                same_starter = rec.starter_pid == starter.pid and rec.starter_start == starter.start
                if same_starter:
                    raise LarkError("this slot's job already has a network in another namespace",
                                    job=rec.job_id, obj=f"slot {starter.slot}",
                                    fix="a job gets one network; do not create new network namespaces")
                carried = old_pin.carried if old_pin and not old_pin.same_starter(starter.pid, starter.start) else None
                await self.loop.run_in_executor(self.pool, self.net.teardown, key, "replaced by a new job", carried)
            plan = self.checked_plan(starter, key)
            if plan is None:
                plan = await self.decide_plan(starter, key)
            if check is not None:
                check(plan)
            built = await self._network(starter, key, plan, job_pid, job_ns)
            return protocol.ok(plan=built.plan, env=env_for(built.plan), exit_barrier=self.exit_barrier())

    async def hold_unnetworked(self, pin: Pin, error: Exception) -> bool:
        """A job whose setup failed after PREPARE_JOB passed must not end as if it ran: the wrapper can only exit
        (HTCondor 25.x then records the job as completed), so larkd holds it at its schedd with the reason, and the
        wrapper waits to be vacated. False when there is no schedd to ask (ad_source files) or it refused."""
        if self.pusher is None or not pin.schedd:
            return False
        reason = f"Lark: job not started, its network could not be set up: {error}"
        held = await self.loop.run_in_executor(self.push_pool, self.pusher.hold, pin.schedd, pin.job_id,
                                               " ".join(reason.split()))
        if held:
            log.warning("held job %s: its network could not be set up: %s", pin.job_id, error)
        return held

    def exit_barrier(self) -> float:
        """How long the job's wrapper waits at the job's end for the final push; 0 (the wrapper execs the job) when
        larkd pushes nothing to a schedd (ad_source files, or pushing off): there is nothing to wait for."""
        return self.cfg.exit_barrier_wait if self.pusher is not None else 0.0

    def pin(self, starter: peercred.StarterInfo, key: str, job_ns: int) -> Pin:
        """The namespace this starter's job was first networked in; refuse any other, even after a release."""
        pin = self.pins.load(key)
        if pin is not None and pin.same_starter(starter.pid, starter.start):
            if pin.netns_inode == TRANSFER_NETNS and job_ns != TRANSFER_NETNS:
                pin.netns_inode = job_ns    # the job's first setup after its input transfer: now it is pinned
                self.pins.save(pin)
            if pin.netns_inode != job_ns:
                raise LarkError("this job was already networked in another network namespace; a job gets one "
                                "network, in the namespace its starter made", obj=f"slot {starter.slot} "
                                f"(namespace {job_ns}, pinned {pin.netns_inode})",
                                fix="do not create network namespaces in a job")
            return pin
        if pin is not None:
            # The slot's previous job ended (another starter now): its pin is stale. Its other state stays for
            # its final release, which finds another starter's pin and ends nothing (or the next one's).
            old = self.jobs.peek(key)
            if old is not None:
                old.stop_watch(self.loop)
        pin = Pin(key=key, starter_pid=starter.pid, starter_start=starter.start, netns_inode=job_ns)
        self.pins.save(pin)
        return pin

    async def op_check(self, who: peercred.Peer) -> bytes:
        """Decide the plan without building anything: the PREPARE_JOB hook's pre-flight, run before the job
        exists, so a policy error, or a plan this EP cannot build (realize/feasibility.py), puts the job on hold
        instead of letting it start."""
        starter = peercred.starter_of(who, self.cfg.starter_paths)
        if starter is None:
            raise LarkError("only a job's starter hooks may ask for a pre-flight check",
                            obj=f"pid {who.pid} uid {who.uid}")
        forbidden = netns.net_namespaces_forbidden()
        if forbidden is not None:
            raise forbidden
        key = job_key(starter.slot)
        # A job can ask for checks too (it descends from the starter): at most one query of the startd and
        # the schedd per starter every check_min_interval; repeats get the same answer.
        ident = f"{starter.pid}:{starter.start}"
        decided = self.check_limit.recent(ident)
        if decided is None:
            try:
                plan = await self.decide_plan(starter, key)
                try:
                    self.net.check_feasible(plan)  # what setup would refuse, refused before the job starts
                except LarkError as e:
                    tag_failure(e, "policy")   # a refusal of the plan: LarkJobsRefused counts it with the policy's
                    raise
                decided = plan.to_dict()
            except LarkError as e:
                decided = e
            self.check_limit.remember(ident, decided)
        if isinstance(decided, LarkError):
            raise decided
        assert isinstance(decided, dict)   # what was remembered above: a plan's dict or its refusal
        # The setup that follows for this same starter reuses the decision instead of asking the startd and
        # the schedd again: those queries are the slowest part of a setup.
        self.jobs.get(key).check = Check(starter.pid, starter.start, time.monotonic(), decided)
        return protocol.ok(plan=decided)

    def checked_plan(self, starter: peercred.StarterInfo, key: str) -> NetworkPlan | None:
        """The pre-flight decision for this very starter (pid and start time), if recent; used once."""
        job = self.jobs.peek(key)
        got = job.check if job is not None else None
        if job is None or got is None:
            return None
        job.check = None
        if (got.starter_pid, got.starter_start) != (starter.pid, starter.start) or \
                time.monotonic() - got.at > CHECK_REUSE_SECONDS:
            return None
        return NetworkPlan.from_dict(got.plan)

    async def decide_plan(self, starter: peercred.StarterInfo, key: str) -> NetworkPlan:
        try:
            return await self.loop.run_in_executor(self.pool, self.plan_for, starter, key)
        except LarkError as e:
            tag_failure(e, "policy")   # counted under lark_failures_total{reason="policy"}
            raise

    def plan_for(self, starter: peercred.StarterInfo, key: str):
        job_ad, machine_ad = self.ads.ads(starter)
        identity = self.ads.identity(job_ad, machine_ad)   # LarkError if the job ad disagrees with its claim
        if identity is not None:
            if len(self.identities) > 4096:  # checks whose setup never came; starters are few at a time
                self.identities.clear()
            self.identities[(starter.pid, starter.start)] = identity
        check_container_network(job_ad, job_id_of(job_ad))  # Apptainer told to leave the job's netns: refused
        return decide(job_ad, machine_ad, self.cfg, starter.slot, key, uplink_mbit=self.uplink_mbit)

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
        for key, pid, start in await self.loop.run_in_executor(self.pool, self.reconcile):
            self.watch(key, pid, start)
        await self.sandbox.adopt()
        path = self.cfg.socket
        os.makedirs(os.path.dirname(path), mode=0o755, exist_ok=True)
        if os.path.exists(path):
            os.unlink(path)
        # A deep backlog: clients wait in it (blocking connect) while a flood is being turned away.
        server = await asyncio.start_unix_server(self.handle, path=path, limit=self.cfg.max_request_bytes,
                                                 backlog=LISTEN_BACKLOG)
        # Any job user must be able to connect; every request is authorised from SO_PEERCRED instead.
        os.chmod(path, 0o666)
        stop = asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGQUIT):  # condor_master stops daemons with SIGQUIT
            self.loop.add_signal_handler(sig, stop.set)
        self.loop.add_signal_handler(signal.SIGHUP, self.reload_config)
        poll = self.spawn(self.poller(), "counter polling")
        self.net.controller.start()  # full resync with the pool's SDN controller now and periodically
        log.info("larkd %s listening on %s (firewall %s, subnet %s, uplink %s)", __version__, path, self.fw.name,
                 self.cfg.subnet, self.cfg.uplink)
        await stop.wait()
        # Jobs keep their networks when larkd stops: a restart adopts them from their records.
        log.info("larkd stopping; %d job networks stay up and will be adopted at the next start",
                 len(self.active))
        poll.cancel()
        server.close()
        self.metrics.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


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
