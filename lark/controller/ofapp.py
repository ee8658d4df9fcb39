"""The os-ken application: every switch that connects gets the controller's base flows and every registered job's
flows; changes go out as flow mods followed by a barrier, and a change counts as done only when each switch has
acknowledged the barrier. Reconciliation removes, by cookie, flows of jobs the controller no longer knows.

Switches are authenticated (issue 26): over TLS a switch counts only when its certificate has the switch role and is
bound to the datapath id it reports, and a connected switch is never replaced by a second connection claiming its
datapath id. Messages from any connection that is not a switch's accepted one are ignored."""
from __future__ import annotations

import gc
import logging
import select
import ssl
import threading
import time
from dataclasses import dataclass, field
from typing import Any, ClassVar

from os_ken.base import app_manager
from os_ken.controller import ofp_event
from os_ken.controller.handler import CONFIG_DISPATCHER, DEAD_DISPATCHER, MAIN_DISPATCHER, set_ev_cls
from os_ken.lib import hub
from os_ken.ofproto import ofproto_v1_3

from ..errors import LarkError
from . import certs, hairpin, labels
from .config import ControllerConfig
from .flows import Flow, base_flows
from .model import BASE_COOKIE, COOKIE_TAG_MASK, JOB_COOKIE_TAG
from .registry import Entry, Registry
from .switch import Switch, SwitchError
from .wan import LIMIT_ACTIONS, WanPlan
from .wan_of import WanMeters
from .wan_queue import WanQueues

log = logging.getLogger("lark.controller")

# Set by `lark-controller run` before the app manager instantiates the app (os-ken creates apps itself).
CONFIG: ControllerConfig | None = None
REGISTRY: Registry | None = None
INSTANCE: LarkSwitchApp | None = None
ALL_COOKIES = 0xFFFFFFFFFFFFFFFF
BATCH_WRITE = 512   # flow mods per write to the switch's connection (a job has at most a handful)
# Reconciliation leaves a job cookie it does not know alone until its flows are this old (or reconcile_grace, if
# shorter): another controller of the pool may have installed it for a registration still on its way here.
STALE_AGE = 10.0
# Every HEAP_FREEZE_INTERVAL seconds the objects that survived a collection are frozen; every HEAP_THAW_INTERVAL
# seconds everything is collected once (settle_heap).
HEAP_FREEZE_INTERVAL = 1.0
HEAP_THAW_INTERVAL = 3600.0


def settle_heap(thaw: bool = False) -> int:
    """Collect what is not frozen, then freeze the survivors (with `thaw`: collect everything first, frozen or not);
    the number of unreachable objects found. See LarkSwitchApp._heap_loop."""
    if thaw:
        gc.unfreeze()
    found = gc.collect()
    gc.freeze()
    return found


@dataclass
class _Waiter:
    done: threading.Event = field(default_factory=threading.Event)
    replies: list = field(default_factory=list)


@dataclass
class _BarrierGroup:
    """Batches acknowledged by one barrier (LarkSwitchApp._acknowledged); barrier None until it is sent."""
    barrier: Any = None
    waiter: _Waiter | None = None
    sent: float = 0.0


def make_limits(app: LarkSwitchApp, plan: WanPlan) -> WanMeters | WanQueues:
    """The app's WAN limits as `[wan] mechanism` says: meters (policing) or queues (shaping)."""
    if plan.mechanism == "queue":
        return WanQueues(app, plan)
    return WanMeters(app, plan)


class OneAtATimeTLS:
    """A switch's TLS connection used by one thread at a time. os-ken reads it in one thread and writes it in another
    (native threads); OpenSSL forbids using one SSL object from two threads at once, and under load the connection
    broke (bench/controller_capacity.py: the controller dropped the switch every ~15 s at 2,000 registrations/s over
    TLS, never over plain TCP). The reader waits for data without the lock, then reads under it."""

    def __init__(self, sock: ssl.SSLSocket):
        self._sock = sock
        self._lock = threading.Lock()

    def recv(self, n: int) -> bytes:
        while True:
            if not self._sock.pending():
                try:
                    readable, _, _ = select.select([self._sock], [], [], self._sock.gettimeout())
                except (ValueError, OSError):   # closed meanwhile: the end of the stream, as os-ken expects it
                    return b""
                if not readable:
                    raise TimeoutError("no data from the switch")   # os-ken's read loop tries again
            with self._lock:
                try:
                    return self._sock.recv(n)
                except ssl.SSLWantReadError:
                    continue

    def sendall(self, data: bytes) -> None:
        with self._lock:
            self._sock.sendall(data)

    def __getattr__(self, name: str):
        return getattr(self._sock, name)


class LarkSwitchApp(app_manager.OSKenApp):
    OFP_VERSIONS: ClassVar[list[int]] = [ofproto_v1_3.OFP_VERSION]   # os-ken reads the class attribute

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        global INSTANCE
        assert CONFIG is not None and REGISTRY is not None, "start the app through `lark-controller run`"
        self.cfg = CONFIG
        self.registry = REGISTRY
        edge = labels.core_flows(self.cfg) if self.cfg.labels_mode == "vlan" else hairpin.base_flows(self.cfg)
        self.base = base_flows(self.cfg) + self.registry.wan.base_flows(self.cfg.site_prefixes) + edge
        self.wan = make_limits(self, self.registry.wan)   # meters or queues, as [wan] mechanism says
        self.switches: dict[int, Switch] = {}
        self._waiters: dict[tuple[int, int], _Waiter] = {}
        self._errors: dict[tuple[int, int], str] = {}
        self._xid_lock = threading.Lock()
        self.started = time.time()
        self.last_reconcile: dict[int, dict] = {}
        INSTANCE = self
        hub.spawn(self._reconcile_loop)
        hub.spawn(self._heap_loop)
        if self.registry.wan.groups:
            hub.spawn(self._limit_poll_loop)

    # -- switch life cycle ----------------------------------------------------------------------------
    def _refusal(self, dp) -> str:
        """Why this connection may not act as switch dp.id ("" = it may). Over TLS (the handshake already checked
        the CA) the certificate must have the switch role and name this datapath id, and the datapath id must not
        belong to a connected switch: its holder would silently take over the switch's flows and barriers."""
        if self.cfg.insecure_plain_openflow:
            return ""   # nothing to check: anyone who reaches the port is a switch (a warning was logged at start)
        getpeercert = getattr(dp.socket, "getpeercert", None)
        der = getpeercert(binary_form=True) if getpeercert is not None else None
        if not der:
            return "no TLS client certificate"
        try:
            bound = certs.switch_dpid(der)
        except ValueError as e:
            return str(e)
        if bound != dp.id:
            return f"its certificate is bound to datapath {bound:016x}"
        current = self.switches.get(dp.id)
        if current is not None and current.dp is not dp and current.dp.is_active:
            return (f"switch {dp.id:016x} is already connected from {current.dp.address[0]} (a switch that restarted "
                    "gets in once the controller's echo requests find the old connection dead)")
        return ""

    def _accepted(self, dp) -> Switch | None:
        """The switch this connection is, None for a connection that was refused or replaced."""
        sw = self.switches.get(dp.id)
        return sw if sw is not None and sw.dp is dp else None

    @set_ev_cls(ofp_event.EventOFPStateChange, [MAIN_DISPATCHER, DEAD_DISPATCHER])
    def _state_change(self, ev) -> None:
        dp = ev.datapath
        if ev.state == MAIN_DISPATCHER and dp.id is not None:
            why = self._refusal(dp)
            if why:
                log.warning("refused OpenFlow connection from %s claiming datapath %016x: %s; a switch needs a "
                            "certificate from `lark-controller certs --dir DIR switch:%016x` (docs/controller.md)",
                            dp.address[0], dp.id, why, dp.id)
                dp.close()
                return
            if isinstance(dp.socket, ssl.SSLSocket):
                dp.socket = OneAtATimeTLS(dp.socket)
            sw = self.switches[dp.id] = Switch(dp)
            log.info("switch %016x connected from %s with ports %s", dp.id, dp.address, sorted(sw.ports))
            hub.spawn(self._switch_up, sw)
        elif ev.state == DEAD_DISPATCHER and dp.id is not None:
            gone = self.switches.get(dp.id)
            if gone is not None and gone.dp is dp:
                del self.switches[dp.id]
                log.warning("switch %016x disconnected; its flows stay and keep working (fail-secure)", dp.id)

    def _switch_up(self, sw: Switch) -> None:
        """A (re)connected switch: base flows plus every registered job's flows, then reconcile if due."""
        try:
            entries = self.registry.entries()
            self.wan.switch_up(sw)
            self._batch(sw, [(BASE_COOKIE, f, "base") for f in self.base]
                        + [(e.cookie, f, e.job.name) for e in entries for f in e.flows], [])
            self.reconcile_base(sw)
            sw.ready.set()
            log.info("switch %016x has the base flows and %d jobs' flows", sw.dp.id, len(entries))
            if self._grace_over():
                self.reconcile(sw)
        except Exception as e:
            log.error("switch %016x: initial flows failed: %s", sw.dp.id, e)

    @set_ev_cls(ofp_event.EventOFPPortStatus, MAIN_DISPATCHER)
    def _port_status(self, ev) -> None:
        # A WAN port that appears after the switch connected: the steering flows name it, so send them again.
        sw = self._accepted(ev.msg.datapath)
        name = ev.msg.desc.name.decode(errors="replace")
        labelled = self.cfg.labels_mode == "vlan" and any(name in s.ports for s in self.cfg.eps.values())
        if sw is not None and sw.ready.is_set() and (name in self.cfg.wan_ports or labelled):
            hub.spawn(self._batch, sw, [(BASE_COOKIE, f, "base") for f in self.base], [])
        elif sw is not None and sw.ready.is_set() and name in self.cfg.ep_ports.values():
            # An EP's port: its hairpin flows (base and its jobs') name it, so send them again.
            eps = {ep for ep, port in self.cfg.ep_ports.items() if port == name}
            hub.spawn(self._batch, sw, [(BASE_COOKIE, f, "base") for f in self.base]
                      + [(e.cookie, f, e.job.name) for e in self.registry.entries() if e.job.ep in eps
                         for f in e.flows], [])

    # -- replies ----------------------------------------------------------------------------------------
    @set_ev_cls([ofp_event.EventOFPBarrierReply, ofp_event.EventOFPFlowStatsReply,
                 ofp_event.EventOFPMeterConfigStatsReply, ofp_event.EventOFPMeterStatsReply,
                 ofp_event.EventOFPQueueStatsReply], MAIN_DISPATCHER)
    def _reply(self, ev) -> None:
        msg = ev.msg
        w = self._waiters.get((msg.datapath.id, msg.xid))
        if w is None or self._accepted(msg.datapath) is None:   # a refused connection cannot ack for the switch
            return
        w.replies.append(msg)
        if not getattr(msg, "flags", 0) & msg.datapath.ofproto.OFPMPF_REPLY_MORE:
            w.done.set()

    @set_ev_cls(ofp_event.EventOFPErrorMsg, [CONFIG_DISPATCHER, MAIN_DISPATCHER])
    def _error(self, ev) -> None:
        msg = ev.msg
        if self._accepted(msg.datapath) is None:
            return
        self._errors[(msg.datapath.id, msg.xid)] = f"OpenFlow error type {msg.type} code {msg.code}"

    def _send(self, dp, msg) -> int:
        with self._xid_lock:
            dp.set_xid(msg)
        dp.send_msg(msg)
        return msg.xid

    def _request(self, dp, msg, timeout: float) -> list:
        return self._wait(dp, msg, self._expect(dp, msg), timeout)

    def _expect(self, dp, msg) -> _Waiter:
        """Send a request whose reply _wait then waits for."""
        with self._xid_lock:
            dp.set_xid(msg)
        w = self._waiters[(dp.id, msg.xid)] = _Waiter()
        dp.send_msg(msg)
        return w

    def _wait(self, dp, msg, w: _Waiter, timeout: float) -> list:
        try:
            if not w.done.wait(timeout):
                raise SwitchError(f"switch {dp.id:016x} did not answer {type(msg).__name__} within "
                                  f"{self.cfg.barrier_timeout if timeout < self.cfg.barrier_timeout else timeout} s")
            return w.replies
        finally:
            self._waiters.pop((dp.id, msg.xid), None)

    # -- flow mods --------------------------------------------------------------------------------------
    def _match(self, sw: Switch, f: Flow) -> dict | None:
        """The flow's match for this switch: an `in_port` given by name becomes the port's number; None when the
        switch has no such port (the flow is not for this switch)."""
        match = dict(f.match)
        if isinstance(match.get("in_port"), str):
            port = sw.ports.get(match["in_port"])
            if port is None:
                log.debug("switch %016x has no port %r: %s not installed there", sw.dp.id, match["in_port"],
                          f.describe())
                return None
            match["in_port"] = port
        return match

    def _mod(self, sw: Switch, cookie: int, f: Flow):
        """The flow as an OFPFC_ADD flow mod for this switch, encoded by os-ken (OFPMatch converts each address
        with netaddr: most of a registration's CPU at site scale, docs/controller.md "Capacity"); None when the
        switch lacks a port the flow names."""
        dp = sw.dp
        p, o = dp.ofproto_parser, dp.ofproto
        match = self._match(sw, f)
        if match is None:
            return None
        kind = f.action[0]
        if kind == "drop":
            inst = []
        elif kind == "goto":
            _, table, md, mask = f.action
            inst = ([p.OFPInstructionWriteMetadata(md, mask)] if mask else []) + [p.OFPInstructionGotoTable(table)]
        elif kind == "pop_goto":         # label scheme (lark.controller.labels): untag, then as "goto"
            _, table, md, mask = f.action
            inst = [p.OFPInstructionActions(o.OFPIT_APPLY_ACTIONS, [p.OFPActionPopVlan()]),
                    p.OFPInstructionWriteMetadata(md, mask), p.OFPInstructionGotoTable(table)]
        elif kind == "normal":
            inst = [p.OFPInstructionActions(o.OFPIT_APPLY_ACTIONS, [p.OFPActionOutput(o.OFPP_NORMAL)])]
        elif kind in LIMIT_ACTIONS:   # WAN group limit (lark.controller.wan): meter or queue, then NORMAL or a port
            out = o.OFPP_NORMAL if kind.endswith("_normal") else sw.ports.get(f.action[2])
            if out is None:
                log.warning("switch %016x has no port %r: %s not installed there", dp.id, f.action[2], f.describe())
                return None
            if kind.startswith("meter"):
                inst = [p.OFPInstructionMeter(f.action[1], o.OFPIT_METER),
                        p.OFPInstructionActions(o.OFPIT_APPLY_ACTIONS, [p.OFPActionOutput(out)])]
            else:
                inst = [p.OFPInstructionActions(o.OFPIT_APPLY_ACTIONS, [p.OFPActionSetQueue(f.action[1]),
                                                                        p.OFPActionOutput(out)])]
        elif kind == "in_port":          # same-EP hairpin (lark.controller.hairpin)
            inst = [p.OFPInstructionActions(o.OFPIT_APPLY_ACTIONS, [p.OFPActionOutput(o.OFPP_IN_PORT)])]
        elif kind == "in_port_normal":
            inst = [p.OFPInstructionActions(o.OFPIT_APPLY_ACTIONS, [p.OFPActionOutput(o.OFPP_IN_PORT),
                                                                    p.OFPActionOutput(o.OFPP_NORMAL)])]
        elif kind == "output":
            port = sw.ports.get(f.action[1])
            if port is None:
                log.warning("switch %016x has no port %r: %s not installed there", dp.id, f.action[1], f.describe())
                return None
            inst = [p.OFPInstructionActions(o.OFPIT_APPLY_ACTIONS, [p.OFPActionOutput(port)])]
        else:
            raise ValueError(f"unknown action {f.action}")
        return p.OFPFlowMod(dp, cookie=cookie, table_id=f.table, priority=f.priority, command=o.OFPFC_ADD,
                            match=p.OFPMatch(**match), instructions=inst)

    def _delete(self, sw: Switch, cookie: int, mask: int = ALL_COOKIES):
        dp = sw.dp
        p, o = dp.ofproto_parser, dp.ofproto
        return p.OFPFlowMod(dp, cookie=cookie, cookie_mask=mask, table_id=o.OFPTT_ALL, command=o.OFPFC_DELETE,
                            out_port=o.OFPP_ANY, out_group=o.OFPG_ANY, match=p.OFPMatch())

    def _batch(self, sw: Switch, adds: list[tuple[int, Flow, str]], removes: list[int]) -> int:
        """Deletes (by cookie), then adds, then a barrier; returns the number of flows added. Raises SwitchError
        naming the job when the switch refused a flow or did not acknowledge in time.

        Batches are pipelined (issue 26 capacity): a batch's messages go out in order and in few writes (one TLS
        record per BATCH_WRITE messages, not one per flow mod) under the switch's lock, and the barrier is waited
        for outside it and shared by the batches sent meanwhile (_acknowledged), so concurrent registrations do not
        queue behind each other's round trips. The switch answers a barrier only after every message sent before
        it, so a batch's errors are in by then."""
        dp = sw.dp
        sent: dict[int, str] = {}
        msgs = [self._delete(sw, cookie) for cookie in removes]
        for cookie, f, who in adds:
            mod = self._mod(sw, cookie, f)
            if mod is not None:
                msgs.append(mod)
                sent[len(msgs) - 1] = who
        if not msgs:
            # Nothing for this switch (label scheme: most jobs have no flow of their own, the core's per-EP flows
            # enforce their policies): nothing to acknowledge, so no barrier round trip. Under the capacity bench
            # the workers spent half their time waiting for such barriers (docs/controller.md "Capacity").
            return 0
        with sw.lock:
            xids = self._send_all(dp, msgs)
            group = sw.pending = sw.pending or _BarrierGroup()
        sent = {xids[i]: who for i, who in sent.items()}
        self._acknowledged(sw, group)
        failed = [(who, self._errors.pop((dp.id, xid))) for xid, who in sent.items() if (dp.id, xid) in self._errors]
        if failed:
            raise SwitchError(f"switch {dp.id:016x} refused flows of " + "; ".join(f"{w}: {e}" for w, e in failed))
        return len(sent)

    def _acknowledged(self, sw: Switch, group: _BarrierGroup) -> None:
        """Wait until the switch acknowledged a barrier sent after this batch's messages. Group commit: one barrier
        at a time is in flight per switch; batches sent meanwhile join the next group, whose first member to see
        the one in flight answered sends the group's one barrier. (When the one in flight is not answered within
        barrier_timeout, the next group sends its own anyway, so a batch waits at most twice that.)"""
        dp, timeout = sw.dp, self.cfg.barrier_timeout
        while True:
            with sw.lock:
                ahead = sw.inflight
                if group.barrier is None and (ahead is None or ahead.waiter is None or ahead.waiter.done.is_set()
                                              or time.monotonic() - ahead.sent >= timeout):
                    group.barrier = dp.ofproto_parser.OFPBarrierRequest(dp)
                    group.waiter = self._expect(dp, group.barrier)
                    group.sent = time.monotonic()
                    sw.inflight, sw.pending = group, None
            if group.barrier is not None and group.waiter is not None:
                self._wait(dp, group.barrier, group.waiter, max(0.0, group.sent + timeout - time.monotonic()))
                return
            if ahead is not None and ahead.waiter is not None:
                ahead.waiter.done.wait(max(0.0, ahead.sent + timeout - time.monotonic()))

    def _send_all(self, dp, msgs: list) -> list[int]:
        """Send messages in order, BATCH_WRITE of them per write; their xids."""
        with self._xid_lock:
            for msg in msgs:
                dp.set_xid(msg)
        for i in range(0, len(msgs), BATCH_WRITE):
            chunk = msgs[i:i + BATCH_WRITE]
            for msg in chunk:
                msg.serialize()
            dp.send(b"".join(msg.buf for msg in chunk))
        return [msg.xid for msg in msgs]

    def apply(self, install: list[Entry], remove: list[Entry]) -> dict:
        """Push a registry change to every connected switch and wait for each barrier."""
        switches = [sw for sw in list(self.switches.values()) if sw.ready.wait(self.cfg.barrier_timeout)]
        adds = [(e.cookie, f, e.job.name) for e in install for f in e.flows]
        removes = [e.cookie for e in remove]
        errors = []
        limits = {m for e in install for m in self.wan.plan.limits_in(e.flows)}
        done = []
        for sw in switches:
            try:
                self.wan.ensure(sw, limits)      # a limit exists before the first flow naming it
                self._batch(sw, adds, removes)
                done.append(sw)
            except (SwitchError, LarkError) as e:
                errors.append(str(e))
        # Only a change that touches a WAN group pays for classify (tc processes with queues) and only one that
        # removes jobs can free a limit: a registration that only adds jobs outside the groups skips both (a
        # delete that failed earlier is retried by reconciliation, which releases everything unused).
        if limits or any(self.wan.plan.limits_in(e.flows) for e in remove):
            try:
                self.wan.classify()              # queues on a userspace datapath: tc by source address (wan_queue)
            except LarkError as e:
                errors.append(str(e))
        for sw in done if removes else []:
            try:
                self.wan.release(sw)             # and is removed after the last flow naming it
            except (SwitchError, LarkError) as e:
                errors.append(str(e))
        return {"switches": len(switches), "flows": len(adds), "removed": len(removes), "errors": errors}

    # -- reconciliation ---------------------------------------------------------------------------------
    def _grace_over(self) -> bool:
        return time.time() - self.started >= self.cfg.reconcile_grace

    def switch_cookies(self, sw: Switch, ages: dict[int, int] | None = None) -> dict[int, int]:
        """Job cookies on the switch, with their number of flows (and in `ages` the age in seconds of each cookie's
        youngest flow)."""
        dp = sw.dp
        p, o = dp.ofproto_parser, dp.ofproto
        req = p.OFPFlowStatsRequest(dp, 0, o.OFPTT_ALL, o.OFPP_ANY, o.OFPG_ANY, JOB_COOKIE_TAG, COOKIE_TAG_MASK,
                                    p.OFPMatch())
        counts: dict[int, int] = {}
        for reply in self._request(dp, req, max(self.cfg.barrier_timeout, 5.0)):
            for stat in reply.body:
                counts[stat.cookie] = counts.get(stat.cookie, 0) + 1
                if ages is not None:
                    ages[stat.cookie] = min(ages.get(stat.cookie, stat.duration_sec), stat.duration_sec)
        return counts

    @property
    def stale_age(self) -> float:
        """Seconds a job cookie unknown here must have been on the switch before reconciliation removes it. With
        two controllers (HA model, docs/controller.md) a job the other one installed a moment ago may not have
        reached this one yet (its EP sends it to both, not at the same instant): its flows must not go."""
        return min(self.cfg.reconcile_grace, STALE_AGE)

    def reconcile_base(self, sw: Switch) -> int:
        """Remove the controller's own flows that the current config no longer has (e.g. a WAN policy deleted
        before a restart), one by one with DELETE_STRICT: the rest keep working meanwhile."""
        dp = sw.dp
        p, o = dp.ofproto_parser, dp.ofproto
        want = {(f.table, f.priority, tuple(sorted(p.OFPMatch(**m).items())))
                for f in self.base if (m := self._match(sw, f)) is not None}
        req = p.OFPFlowStatsRequest(dp, 0, o.OFPTT_ALL, o.OFPP_ANY, o.OFPG_ANY, BASE_COOKIE, ALL_COOKIES,
                                    p.OFPMatch())
        stale = [st for reply in self._request(dp, req, max(self.cfg.barrier_timeout, 5.0)) for st in reply.body
                 if (st.table_id, st.priority, tuple(sorted(st.match.items()))) not in want]
        for st in stale:
            self._send(dp, p.OFPFlowMod(dp, cookie=BASE_COOKIE, cookie_mask=ALL_COOKIES, table_id=st.table_id,
                                        priority=st.priority, command=o.OFPFC_DELETE_STRICT, out_port=o.OFPP_ANY,
                                        out_group=o.OFPG_ANY, match=st.match))
        if stale:
            self._request(dp, p.OFPBarrierRequest(dp), self.cfg.barrier_timeout)
            log.info("switch %016x: removed %d flows of policies no longer configured", dp.id, len(stale))
        return len(stale)

    def reconcile(self, sw: Switch) -> dict:
        """Remove the flows of every job cookie on the switch that no registered job owns."""
        ages: dict[int, int] = {}
        on_switch = self.switch_cookies(sw, ages)
        known = self.registry.cookies()    # after the listing: a job registered meanwhile counts as known
        stale = [c for c in on_switch if c not in known and ages.get(c, 0) >= self.stale_age]
        if stale:
            self._batch(sw, [], stale)
        self.wan.reconcile(sw)
        if stale:
            log.info("switch %016x: removed the flows of %d jobs that are gone (cookies %s)", sw.dp.id, len(stale),
                     ", ".join(f"{c:#x}" for c in stale[:10]))
        result = {"at": time.time(), "stale_removed": len(stale), "job_cookies": len(on_switch) - len(stale)}
        self.last_reconcile[sw.dp.id] = result
        return result

    def reconcile_all(self) -> None:
        for sw in list(self.switches.values()):
            if sw.ready.is_set():
                try:
                    self.reconcile(sw)
                except Exception as e:
                    log.error("switch %016x: reconciliation failed: %s", sw.dp.id, e)

    def _limit_poll_loop(self) -> None:
        while True:
            for sw in list(self.switches.values()):
                if sw.ready.is_set():
                    try:
                        self.wan.poll(sw)
                    except Exception as e:
                        log.warning("switch %016x: WAN limit stats: %s", sw.dp.id, e)
            time.sleep(2.0)

    def _heap_loop(self) -> None:
        """Keep Python's full garbage collections short. The registry's objects live as long as their jobs, and a
        full collection traverses every object (it runs whenever the heap grew by a quarter): under the capacity
        bench it stopped every thread for 77-88 ms at 15,000 jobs, which was the registrations' p99 at a rate the
        controller kept up with (docs/controller.md "Capacity"). So once a second, after a collection of what
        is not frozen yet (young objects, and what was promoted within the last second), the survivors are frozen:
        later collections skip them. A frozen object is still freed when its last reference goes (the registry's
        objects hold no reference cycles); a cycle among frozen objects stays until the hourly collection of
        everything (one pause as long as before, once an hour instead of at every quarter of growth)."""
        thawed = time.monotonic()
        while True:
            time.sleep(HEAP_FREEZE_INTERVAL)
            thaw = time.monotonic() - thawed >= HEAP_THAW_INTERVAL
            if thaw:
                thawed = time.monotonic()
            settle_heap(thaw)

    def _reconcile_loop(self) -> None:
        time.sleep(self.cfg.reconcile_grace)
        while True:
            self.reconcile_all()
            time.sleep(self.cfg.reconcile_interval)
