"""WAN group limits by queues (`[wan] mechanism = "queue"`, issue 12): shaping instead of policing.

Per (group, WAN port) one queue, id = group index + 1 (lark.controller.wan.queue_id), at the group's rate on that
port. The per-job flows send the job's WAN traffic to it with OpenFlow `set_queue` (honoured by the kernel datapath
and hardware switches). On an Open vSwitch whose OVSDB the controller reaches (`[wan] ovsdb`):
- a linux-htb QoS row per WAN port and one Queue row per group there (other_config max-rate = min-rate = the rate),
  made when the group's first job on that port registers and removed after its last leaves; Lark's rows carry
  external_ids lark-owner=controller (and lark-group, lark-port); the controller never touches other rows, and
  refuses a WAN port whose QoS someone else made. At (re)connect it re-rates its queues to the config and removes
  those of groups no longer configured; unused ones go at reconciliation (after reconcile_grace), as meters do.
- OVS makes the htb: class 1:(queue id + 1) per queue under root class 1:fffe.
- userspace (netdev) datapath: it ignores set_queue (ARCHITECTURE.md), so the controller classifies in the kernel
  itself: per job a leaf htb class 1:f001..1:fffd under its group's class (OVS ignores classes above 0xf000) and one
  u32 filter per job address at the root qdisc, `src ADDR -> the job's class`. The job classes share the group's
  rate round robin (same quantum, in bytes: QUANTUM), so the jobs of a group get equal shares (this kernel has
  neither sfq nor fq_codel). Lark's packets bounce through an ifb first (plan_bounce): the userspace datapath sends
  on every veth port through one AF_PACKET socket, and a packet that waits in a qdisc holds that socket's send
  buffer (net.core.wmem_default, 212992 bytes: about three 64 KB TSO packets) until it leaves; once the slow groups'
  queues held it full, the switch dropped what it sent on every port (measured: a 900 Mbit/s cms job at 12.7 Mbit/s
  behind 8 jobs of a 100 Mbit/s group, the socket at 139-246 KB of 208 KB). mirred's redirect sends a clone, which
  no socket owns, and frees the original: the packet comes back from the ifb into the port's htb owning nothing
  (same test: 859.4 Mbit/s, the socket empty). This needs the WAN port's device in the controller's network
  namespace: run the controller on the switch host. Filters are Lark's by their priority (PREF_V4, PREF_V6,
  PREF_BOUNCE); tc runs as one `tc -batch` per change, read back with `tc -json` (pyroute2 0.9.7 decodes u32
  selectors wrongly: keys come back shifted).
Without an OVSDB (`ovsdb = ""`), the site made the queues itself (hardware, vendor tooling): Lark only sends
set_queue with the ids above and counts queue stats.
"""
from __future__ import annotations

import ipaddress
import json
import logging
import os
import re
import subprocess
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ..errors import LarkError
from ..kernel.attach.ovsdb import Ovsdb
from .wan import LimitCounters, WanPlan, queue_id

log = logging.getLogger("lark.controller.wan")

OWNER = {"lark-owner": "controller"}
PREF_V4, PREF_V6 = 0x4C00, 0x4C01        # tc filter priorities Lark owns on its QoS's root qdisc
PREF_BOUNCE = 0x4C02                      # Lark's egress filter on a WAN port: everything through the ifb
LEAF_FIRST, LEAF_LAST = 0xF001, 0xFFFD    # job classes: minors OVS does not read as queues (it reads <= 0xf000)
ROOT = "1:"                               # the handle OVS gives its linux-htb root qdisc
LEAF_RATE = "8kbit"                       # a job class's own rate: everything above is borrowed from the group's
# A job class's DRR quantum: equal for all, so the group's jobs share its rate, and above the largest packet (64 KB
# TSO packets from the userspace datapath). htb lets a class at the head of the round send one packet whatever its
# deficit, so with a 1514-byte quantum every class sent one packet per turn: per packet, not per byte, and a job
# whose TCP made larger TSO packets got more (two Reno uploads of one group split 0.39 and 0.77, and 0.81 in a
# two-job test that splits 0.99-1.00 with this quantum).
QUANTUM = "131072"
BURST_S = 0.01                            # bursts of 10 ms at the class's rate


def burst_bytes(bps: float) -> int:
    """htb burst of a group's class and cburst of its job classes: BURST_S of the rate. OVS's default (one MTU)
    and tc's (rate / HZ + MTU) held 1242-byte UDP packets to 0.88 of a 50 Mbit/s rate here."""
    return max(3000, round(bps * BURST_S / 8))


def group_class(g: int) -> int:
    """Minor of the htb class OVS makes for the group's queue."""
    return queue_id(g) + 1


@dataclass(frozen=True)
class TcFilter:
    pref: int
    protocol: str
    handle: str
    classid: int            # minor under 1:
    address: str


@dataclass
class TcState:
    """Lark's part of the tc state on one WAN port: its job classes (minor -> parent minor) and its filters."""
    classes: dict[int, int] = field(default_factory=dict)
    filters: list[TcFilter] = field(default_factory=list)
    ceils: dict[int, float] = field(default_factory=dict)   # job class minor -> its ceil, bit/s (when read)


def _minor(handle: str) -> int:
    return int(handle.split(":")[1] or "0", 16)


def parse_classes(text: str) -> dict[int, int]:
    """`tc class show` (iproute2 6.1 prints htb classes only as text) -> job classes (minor in the Lark range) and
    their parents' minors."""
    out = {}
    for m in re.finditer(r"^class htb 1:([0-9a-f]+) parent 1:([0-9a-f]+)", text, re.M):
        minor = int(m.group(1), 16)
        if LEAF_FIRST <= minor <= LEAF_LAST:
            out[minor] = int(m.group(2), 16)
    return out


UNITS = {"bit": 1, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9, "tbit": 1e12}


def parse_ceils(text: str) -> dict[int, float]:
    """`tc class show` -> job class minor -> ceil in bit/s (so a group's new rate reaches its jobs' classes)."""
    out = {}
    for m in re.finditer(r"^class htb 1:([0-9a-f]+) parent .*? ceil ([0-9.]+)([KMGT]?bit)", text, re.M):
        minor = int(m.group(1), 16)
        if LEAF_FIRST <= minor <= LEAF_LAST:
            out[minor] = float(m.group(2)) * UNITS[m.group(3).lower()]
    return out


def parse_filters(text: str) -> list[TcFilter]:
    """`tc -json filter show` -> Lark's u32 filters (its priorities): one source address each. iproute2 prints one
    "match" key per 32-bit key (repeated keys in one object), hence the pairs hook."""
    out = []
    for f in json.loads(text or "[]", object_pairs_hook=lambda pairs: pairs):
        f = dict(f)
        opts = f.get("options")
        if f.get("kind") != "u32" or f.get("pref") not in (PREF_V4, PREF_V6) or not opts:
            continue
        opts_d = dict(opts)
        if "flowid" not in opts_d:
            continue
        keys = {dict(v)["off"]: int(dict(v)["value"], 16) for k, v in opts if k == "match"}
        if f["pref"] == PREF_V4 and set(keys) == {12}:
            addr = str(ipaddress.IPv4Address(keys[12]))
        elif f["pref"] == PREF_V6 and set(keys) == {8, 12, 16, 20}:
            addr = str(ipaddress.IPv6Address(b"".join(keys[o].to_bytes(4, "big") for o in (8, 12, 16, 20))))
        else:
            continue
        out.append(TcFilter(f["pref"], f["protocol"], opts_d["fh"], _minor(opts_d["flowid"]), addr))
    return out


@dataclass(frozen=True)
class JobQueue:
    """A registered job whose WAN traffic goes to a queue on this port: its group's class and its addresses."""
    group_class: int
    addresses: frozenset[str]
    ceil_mbit: float


def plan_port(dev: str, jobs: dict[int, JobQueue], state: TcState, leaves: dict[int, int], owned: set[int],
              everything: bool = False) -> tuple[list[list[str]], dict[int, int]]:
    """The tc commands that make `dev`'s job classes and filters match the registered jobs (cookie -> JobQueue),
    and the new cookie -> class minor map. `leaves`: this process's map; `owned`: classes this process made or
    adopted (updated in place). Classes and filters of jobs it does not know (found at a restart) are removed only
    with `everything` (reconciliation, once every larkd has resynced), unless a registered job took the address."""
    by_class: dict[int, set[str]] = {}
    for f in state.filters:
        by_class.setdefault(f.classid, set()).add(f.address)
    new: dict[int, int] = {}
    taken = set()
    for cookie, jq in jobs.items():
        minor = leaves.get(cookie)
        if minor is None or state.classes.get(minor) != jq.group_class:
            # after a restart: adopt the class whose filters carry exactly this job's addresses
            minor = next((m for m, parent in state.classes.items() if parent == jq.group_class and m not in taken
                          and by_class.get(m) == set(jq.addresses)), None)
        if minor is not None:
            new[cookie] = minor
            taken.add(minor)
    free = (m for m in range(LEAF_FIRST, LEAF_LAST + 1) if m not in state.classes and m not in taken)
    adds, f_del, f_add, c_del = [], [], [], []
    for cookie, jq in jobs.items():
        ceil = state.ceils.get(new.get(cookie, -1))
        if ceil is not None and abs(ceil - jq.ceil_mbit * 1e6) > 0.01 * jq.ceil_mbit * 1e6:
            # The group's rate changed (config reload, controller restart): its jobs' classes follow.
            adds.append(["class", "change", "dev", dev, "parent", f"1:{jq.group_class:x}", "classid",
                         f"1:{new[cookie]:x}", "htb", "rate", LEAF_RATE, "ceil", f"{jq.ceil_mbit:g}mbit", "cburst",
                         f"{burst_bytes(jq.ceil_mbit * 1e6)}b", "quantum", QUANTUM])
        if cookie not in new:
            try:
                new[cookie] = minor = next(free)
            except StopIteration:
                raise LarkError(f"no free tc class for another job ({LEAF_LAST - LEAF_FIRST + 1} in use)",
                                obj=f"WAN port {dev}", fix="fewer jobs with WAN limits on this port") from None
            adds.append(["class", "add", "dev", dev, "parent", f"1:{jq.group_class:x}", "classid", f"1:{minor:x}",
                         "htb", "rate", LEAF_RATE, "ceil", f"{jq.ceil_mbit:g}mbit", "cburst",
                         f"{burst_bytes(jq.ceil_mbit * 1e6)}b", "quantum", QUANTUM])
    owned.update(new.values())
    want = {a: new[c] for c, jq in jobs.items() for a in jq.addresses}
    keep = set(new.values())
    gone = {m for m in state.classes if m not in keep and (everything or m in owned)}
    have = set()
    for f in state.filters:
        if want.get(f.address) == f.classid and (f.address, f.classid) not in have:
            have.add((f.address, f.classid))
        elif f.address in want or f.classid in gone or everything or f.classid not in state.classes:
            f_del.append(["filter", "del", "dev", dev, "parent", ROOT, "protocol", f.protocol, "prio", str(f.pref),
                          "handle", f.handle, "u32"])
    for addr, minor in sorted(want.items()):
        if (addr, minor) not in have:
            v6 = ipaddress.ip_address(addr).version == 6
            f_add.append(["filter", "add", "dev", dev, "parent", ROOT, "protocol", "ipv6" if v6 else "ip", "prio",
                          str(PREF_V6 if v6 else PREF_V4), "u32", "match", "ip6" if v6 else "ip", "src",
                          f"{addr}/{128 if v6 else 32}", "flowid", f"1:{minor:x}"])
    for m in sorted(gone):
        c_del.append(["class", "del", "dev", dev, "classid", f"1:{m:x}"])
        owned.discard(m)
    return adds + f_del + f_add + c_del, new


def tc_argv(netns: str = "") -> list[str]:
    """`tc`, in the WAN ports' named netns when the controller runs beside the switch's namespace ([wan] tc_netns)."""
    return ["tc", "-netns", netns] if netns else ["tc"]


def ip_argv(netns: str = "") -> list[str]:
    return ["ip", "-netns", netns] if netns else ["ip"]


def device_exists(dev: str, netns: str = "") -> bool:
    if not netns:
        return os.path.exists(f"/sys/class/net/{dev}")
    cp = subprocess.run([*ip_argv(netns), "link", "show", "dev", dev], capture_output=True, timeout=10)
    return cp.returncode == 0


def tc_show(dev: str, netns: str, *what: str, check: bool = True) -> str:
    """`tc [-json] KIND show dev DEV [...]`'s output; with `check`, a failure names the port and the fix."""
    json_ = ["-json"] if what[0] == "filter" else []
    cp = subprocess.run([*tc_argv(netns), *json_, what[0], "show", "dev", dev, *what[1:]], capture_output=True,
                        text=True, timeout=30)
    if cp.returncode and check:
        plural = f"{what[0]}{'es' if what[0].endswith('s') else 's'}"
        raise LarkError(f"tc cannot read its {plural}: {cp.stderr.strip()}", obj=f"WAN port {dev}",
                        fix="run the controller on the switch host, in the WAN ports' network namespace "
                            "(or name it in [wan] tc_netns)")
    return cp.stdout


def tc_batch(commands: list[list[str]], what: str, netns: str = "") -> None:
    """All commands in one `tc -batch` (argv lists, no shell); an error names the object and the failing line."""
    if not commands:
        return
    cp = subprocess.run([*tc_argv(netns), "-batch", "-"], input="".join(" ".join(c) + "\n" for c in commands),
                        capture_output=True, text=True, timeout=30)
    if cp.returncode:
        raise LarkError(f"tc refused a change: {cp.stderr.strip()[-400:]}", obj=what,
                        fix="see `tc class show dev PORT` and `tc filter show dev PORT`; the controller retries at "
                            "the next change and at reconciliation")


def tc_read(dev: str, netns: str = "") -> TcState:
    classes = tc_show(dev, netns, "class")
    return TcState(parse_classes(classes), parse_filters(tc_show(dev, netns, "filter")), parse_ceils(classes))


def bounce_name(dev: str) -> str:
    """The ifb Lark bounces a WAN port's packets through (IFNAMSIZ: 15 characters)."""
    return f"lq-{dev}"[:15]


@dataclass(frozen=True)
class BounceState:
    """What a WAN port has of the bounce: the ifb, a clsact qdisc, Lark's egress filter, and other egress or
    ingress filters on that clsact (the site's: they keep it)."""
    ifb: bool
    clsact: bool
    lark_filter: bool
    other_filters: bool


def parse_bounce(qdiscs: str, filters_json: str, ifb_exists: bool) -> BounceState:
    """`tc qdisc show dev PORT`, `tc -json filter show dev PORT egress` (and ingress, concatenated as two JSON
    lists) and whether the ifb exists -> BounceState."""
    found = []
    for chunk in filters_json.split("\n"):
        if chunk.strip():
            found += json.loads(chunk)
    prefs = {f.get("pref") for f in found if f.get("kind")}
    return BounceState(ifb_exists, bool(re.search(r"^qdisc clsact ", qdiscs, re.M)), PREF_BOUNCE in prefs,
                       bool(prefs - {PREF_BOUNCE}))


def plan_bounce(dev: str, on: bool, st: BounceState) -> tuple[list[list[str]], list[list[str]]]:
    """(`ip` commands, `tc` batch lines) that make `dev`'s egress go through its ifb and back (on), or undo it
    (off): a clsact qdisc (kept when the site's own filters are on it) and one u32 filter matching everything with
    mirred redirect to the ifb. Nothing when the port already is so, which makes both directions safe to repeat."""
    ifb = bounce_name(dev)
    if on:
        ip = [] if st.ifb else [["link", "add", ifb, "type", "ifb"], ["link", "set", ifb, "up"]]
        tc = ([] if st.clsact else [["qdisc", "add", "dev", dev, "clsact"]]) + ([] if st.lark_filter else [
            ["filter", "add", "dev", dev, "egress", "protocol", "all", "prio", str(PREF_BOUNCE), "u32", "match", "u32",
             "0", "0", "action", "mirred", "egress", "redirect", "dev", ifb]])
        return ip, tc
    tc = [["filter", "del", "dev", dev, "egress", "protocol", "all", "prio", str(PREF_BOUNCE)]] if st.lark_filter \
        else []
    if st.clsact and not st.other_filters:
        tc.append(["qdisc", "del", "dev", dev, "clsact"])
    return ([["link", "del", ifb]] if st.ifb else []), tc


def bounce_read(dev: str, netns: str = "") -> BounceState:
    qdiscs = tc_show(dev, netns, "qdisc")
    filters = ""
    if re.search(r"^qdisc clsact ", qdiscs, re.M):
        for hook in ("egress", "ingress"):
            filters += tc_show(dev, netns, "filter", hook, check=False).strip() + "\n"
    return parse_bounce(qdiscs, filters, device_exists(bounce_name(dev), netns))


def ip_run(commands: list[list[str]], what: str, netns: str = "") -> None:
    for argv in commands:
        cp = subprocess.run([*ip_argv(netns), *argv], capture_output=True, text=True, timeout=30)
        if cp.returncode:
            raise LarkError(f"`ip {' '.join(argv)}` failed: {cp.stderr.strip()}", obj=what,
                            fix="the kernel needs the ifb module (modprobe ifb); see `ip link show type ifb`")


class WanQueues:
    """The queue mechanism's hooks for ofapp.LarkSwitchApp (the same as WanMeters'). Queues live in the switch's
    OVSDB, not per OpenFlow connection: every connected switch gets the same set_queue flows."""

    def __init__(self, app, plan: WanPlan):
        self.app = app
        self.plan = plan
        self.counters = LimitCounters()
        self.db: Ovsdb | None = None
        self._present: set[int] = set()   # WAN ports whose device was found (_tc_ports)
        self._bounced: set[int] = set()   # WAN ports whose packets this process made bounce through the ifb
        if app.cfg.wan_ovsdb:
            self.db = Ovsdb(app.cfg.wan_ovsdb, tables=("Open_vSwitch", "Bridge", "Port", "QoS", "Queue"))
        self.used: set[tuple[int, int]] = set()      # limits this process made or used for a registered job
        self.leaves: dict[int, dict[int, int]] = {}  # port index -> job cookie -> its tc class minor
        self.owned: dict[int, set[int]] = {}         # port index -> tc classes this process made or adopted
        self._lock = threading.RLock()

    # -- OVSDB ---------------------------------------------------------------------------------------------
    def _ovsdb(self) -> Ovsdb:
        """The switch's OVSDB, for the paths taken only when `[wan] ovsdb` names one."""
        if self.db is None:
            raise LarkError("Lark makes no queues without the switch's OVSDB", obj="[wan] ovsdb",
                            fix='name the OVSDB of the switch with the WAN ports, '
                                'e.g. "unix:/var/run/openvswitch/db.sock"')
        return self.db

    def _port_row(self, p: int):
        name = self.plan.port_name(p)
        row = next((r for r in self._ovsdb().rows("Port") if r.name == name), None)
        if row is None:
            raise LarkError("the switch's OVSDB has no such port", obj=f"WAN port {name}",
                            fix=f"add it to the core bridge, or fix wan_ports / [wan] ovsdb ({self._ovsdb().remote})")
        return row

    def _lark_qos(self, p: int):
        """The port's QoS row if Lark made it, None if it has none; a LarkError if someone else's is there."""
        row = self._port_row(p)
        qos = row.qos[0] if row.qos else None
        if qos is not None and qos.external_ids.get("lark-owner") != "controller":
            raise LarkError(f"has QoS {qos.uuid} ({qos.type}) that Lark did not make", obj=f"WAN port {row.name}",
                            fix="remove it (ovs-vsctl clear port PORT qos) so Lark can make its queues, or make "
                                'the queues yourself and set [wan] ovsdb = ""')
        return qos

    def _queue_cfg(self, g: int, p: int) -> dict:
        bps = round(self.plan.rate_mbit((g, p)) * 1e6)
        return {"max-rate": str(bps), "min-rate": str(bps), "burst": str(burst_bytes(bps) * 8)}

    def lark_queues(self) -> dict[tuple[int, int], Any]:
        """Lark's Queue rows in Lark's QoS rows on the WAN ports: (group, port) -> row; rows whose group is not
        configured (any more, or at another position) under the key (-1, port) list."""
        out: dict = {}
        for p in range(len(self.plan.wan_ports)):
            qos = self._lark_qos(p)
            for key, q in (qos.queues.items() if qos is not None else ()):
                g = key - 1
                ok = 0 <= g < len(self.plan.groups) and q.external_ids.get("lark-group") == self.plan.groups[g].name
                if ok:
                    out[(g, p)] = q
                else:
                    out.setdefault((-1, p), []).append((key, q))
        return out

    def _datapath(self, p: int) -> str:
        name = self.plan.port_name(p)
        for br in self._ovsdb().rows("Bridge"):
            if any(port.name == name for port in br.ports):
                return br.datapath_type or "system"
        return "system"

    def _make(self, limits: list[tuple[int, int]]) -> None:
        """One transaction: Lark's QoS on each port that lacks it, a Queue per limit; waits for ovs-vswitchd."""
        api = self._ovsdb().api
        cmds = []
        for p in sorted({p for _, p in limits}):
            port = self.plan.port_name(p)
            qos = self._lark_qos(p)
            new = {queue_id(g): api.db_create("Queue", other_config=self._queue_cfg(g, p), external_ids={
                **OWNER, "lark-group": self.plan.groups[g].name, "lark-port": port}) for g, pp in limits if pp == p}
            cmds += list(new.values())
            if qos is None:
                qos_cmd = api.db_create("QoS", type="linux-htb", queues=new,
                                        external_ids={**OWNER, "lark-port": port})
                cmds += [qos_cmd, api.db_set("Port", port, ("qos", qos_cmd))]
            else:
                cmds.append(api.db_add("QoS", qos.uuid, "queues", new))
        self._ovsdb().run("Lark's WAN queues " + ", ".join(self.plan.describe(lim) for lim in limits), *cmds)

    def _remove(self, limits: list[tuple[int, int]], strays: Sequence[tuple[int, int, Any]] = ()) -> None:
        """One transaction: the queues of `limits` (and stray Lark queues: (key, port, row)), and a QoS left
        without queues (the port then has no qdisc of Lark's)."""
        api = self._ovsdb().api
        have = self.lark_queues()
        gone: dict[int, list[tuple[int, Any]]] = {}
        for g, p in limits:
            if (g, p) in have:
                gone.setdefault(p, []).append((queue_id(g), have[(g, p)]))
        for key, p, row in strays:
            gone.setdefault(p, []).append((key, row))
        cmds, emptied = [], []
        for p, items in gone.items():
            qos = self._lark_qos(p)
            if qos is None:
                continue
            if len(qos.queues) <= len(items):
                cmds += [api.db_clear("Port", self.plan.port_name(p), "qos"), api.db_destroy("QoS", qos.uuid)]
                emptied.append(p)
            else:
                cmds.append(api.db_remove("QoS", qos.uuid, "queues", *[k for k, _ in items]))
            cmds += [api.db_destroy("Queue", row.uuid) for _, row in items]
        if cmds:
            self._ovsdb().run("removing Lark's WAN queues " + ", ".join(self.plan.describe(lim) for lim in limits),
                              *cmds)
        tc_ports = self._tc_ports() if emptied else []
        for p in emptied:
            if p in tc_ports:
                self._bounce(p, False)     # Lark has no QoS there any more: nothing of its to bounce

    # -- tc (userspace datapath) ---------------------------------------------------------------------------
    def _tc_ports(self) -> list[int]:
        """WAN ports on a userspace (netdev) datapath that have Lark's QoS: the controller classifies there."""
        if self.db is None:
            return []
        ports = [p for p in range(len(self.plan.wan_ports)) if self._datapath(p) == "netdev"]
        netns = self.app.cfg.wan_tc_netns
        for p in ports:
            # Checked once per port: classify runs at every registration, and in another netns the check is a
            # process (a WAN port is not renamed under a running controller).
            if p in self._present:
                continue
            if device_exists(self.plan.port_name(p), netns):
                self._present.add(p)
            else:
                where = f"network namespace {netns}" if netns else "controller's network namespace"
                raise LarkError(f"is on a userspace datapath, which ignores set_queue, and its device is not in the "
                                f"{where}, so the controller cannot classify by tc",
                                obj=f"WAN port {self.plan.port_name(p)}",
                                fix='run lark-controller on the switch host (name the WAN ports\' namespace in [wan] '
                                    'tc_netns if it is another), or use [wan] mechanism = "meter"')
        return ports

    def classify(self, everything: bool = False) -> None:
        """Per WAN port on a userspace datapath: a tc class per registered job under its group's class and a
        filter per job address, and none for jobs that left (for unknown ones only with `everything`)."""
        with self._lock:
            for p in self._tc_ports():
                dev = self.plan.port_name(p)
                jobs = {}
                for e in self.app.registry.entries():
                    addrs: set[str] = set()
                    group = -1
                    for f in e.flows:
                        source = WanPlan.sources(f)   # a limit flow's job address: never None for these
                        for g, pp in self.plan.limits_in([f]):
                            if pp == p and source is not None:
                                addrs.add(source)
                                group = g
                    if addrs:
                        jobs[e.cookie] = JobQueue(group_class(group), frozenset(addrs),
                                                  self.plan.rate_mbit((group, p)))
                if jobs:
                    self._bounce(p, True)
                state = tc_read(dev, self.app.cfg.wan_tc_netns)
                owned = self.owned.setdefault(p, set())
                cmds, self.leaves[p] = plan_port(dev, jobs, state, self.leaves.get(p, {}), owned, everything)
                if cmds:
                    tc_batch(cmds, f"WAN port {dev}", self.app.cfg.wan_tc_netns)
                    log.info("WAN port %s: tc classification now %d jobs (%d commands)", dev, len(jobs), len(cmds))

    def _bounce(self, p: int, on: bool) -> None:
        """Port p's packets bounce through its ifb before its htb (on), or not any more (off; after Lark's QoS on
        the port is gone): see the module doc. Read from the kernel each time but once per process for `on`."""
        if on and p in self._bounced:
            return
        dev, netns = self.plan.port_name(p), self.app.cfg.wan_tc_netns
        ip, tc = plan_bounce(dev, on, bounce_read(dev, netns))
        what = f"WAN port {dev} (ifb {bounce_name(dev)})"
        if on:
            ip_run(ip, what, netns)
            tc_batch(tc, what, netns)
            self._bounced.add(p)
        else:
            tc_batch(tc, what, netns)
            ip_run(ip, what, netns)
            self._bounced.discard(p)
        if ip or tc:
            log.info("WAN port %s: Lark's packets %s ifb %s", dev, "now bounce through" if on else "no longer bounce "
                     "through", bounce_name(dev))

    # -- life cycle (the hooks WanMeters has) --------------------------------------------------------------
    def ensure(self, sw, limits: set[tuple[int, int]]) -> None:
        """Make the queues the next flows name (once for all switches: they are the OVSDB's)."""
        with self._lock:
            self.used.update(limits)
            if self.db is None:
                return
            missing = sorted(set(limits) - set(self.lark_queues()))
            if missing:
                self._make(missing)
                log.info("created WAN queues %s", ", ".join(self.plan.describe(m) for m in missing))

    def release(self, sw, everything: bool = False) -> None:
        """Remove the queues no registered job needs (a group's last job on the port left); everything=True also
        those found at start (reconciliation). Their job classes go first (OVS cannot delete a class with
        children)."""
        with self._lock:
            if self.db is None:
                return
            needed = set(self.app.registry.wan_limits_needed())
            have = {k for k in self.lark_queues() if k[0] >= 0}
            unused = sorted((have if everything else have & self.used) - needed)
            self.used.difference_update(unused)
            if unused:
                self.classify(everything)
                self._remove(unused)
                for lim in unused:
                    self.counters.forget(None, lim)
                log.info("deleted WAN queues %s (no job of the group left there)",
                         ", ".join(self.plan.describe(m) for m in unused))

    def switch_up(self, sw) -> None:
        """A (re)connected switch: Lark's queues re-rated to the config, those of groups no longer configured
        removed, missing ones for registered jobs made. Unused ones wait for reconcile()."""
        with self._lock:
            if self.db is None:
                return
            have = self.lark_queues()
            strays = [(key, p, row) for (g, p), items in have.items() if g < 0 for key, row in items]
            if strays:
                self.classify(everything=True)
                self._remove([], strays)
                log.info("removed %d WAN queues of groups no longer configured", len(strays))
            api = self._ovsdb().api
            rerate = [(lim, row) for lim, row in have.items() if lim[0] >= 0
                      and dict(row.other_config) != self._queue_cfg(*lim)]
            if rerate:
                self._ovsdb().run("re-rating Lark's WAN queues", *[api.db_set("Queue", row.uuid, (
                    "other_config", self._queue_cfg(*lim))) for lim, row in rerate])
                log.info("re-rated WAN queues %s to the config", ", ".join(self.plan.describe(m) for m, _ in rerate))
        self.ensure(sw, set(self.app.registry.wan_limits_needed()))
        self.classify()

    def reconcile(self, sw) -> None:
        self.ensure(sw, set(self.app.registry.wan_limits_needed()))
        self.classify(everything=True)
        self.release(sw, everything=True)

    def poll(self, sw) -> None:
        """Queue stats (tx bytes per port and queue) over OpenFlow: on OVS they are the htb classes' counters."""
        dp = sw.dp
        p, o = dp.ofproto_parser, dp.ofproto
        names = {no: name for name, no in sw.ports.items()}
        req = p.OFPQueueStatsRequest(dp, 0, o.OFPP_ANY, o.OFPQ_ALL)
        for reply in self.app._request(dp, req, max(self.app.cfg.barrier_timeout, 5.0)):
            for q in reply.body:
                name = names.get(q.port_no)
                g = q.queue_id - 1
                if name in self.plan.wan_ports and 0 <= g < len(self.plan.groups):
                    self.counters.update(dp.id, (g, self.plan.wan_ports.index(name)), q.tx_bytes)

    def status(self) -> list[dict]:
        return self.counters.status(self.plan, self.app.registry.wan_limits_needed())
