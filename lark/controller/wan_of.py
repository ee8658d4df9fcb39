"""The OpenFlow 1.3 side of the WAN group limits: meters on each switch, one per (group, WAN port), made, removed,
reconciled and counted through os-ken (the app's own connection; no ovs-ofctl). Called by ofapp.LarkSwitchApp at
its hooks. The queue mechanism (lark.controller.wan_queue) has the same hooks."""
from __future__ import annotations

import logging
import threading

from .switch import SwitchError
from .wan import LimitCounters, WanPlan, is_lark_meter, meter_id, meter_limit

log = logging.getLogger("lark.controller.wan")


def passed_bytes(stats) -> int:
    """What a meter let through to the WAN: the bytes it was offered less what its drop band dropped. The group's
    share is what it sent to the WAN; a policed TCP upload's dropped segments are sent again and would otherwise be
    counted twice (seen: 1.13 of what the WAN router received)."""
    return int(stats.byte_in_count) - sum(int(b.byte_band_count) for b in stats.band_stats)


class WanMeters:
    def __init__(self, app, plan: WanPlan):
        self.app = app
        self.plan = plan
        self.on_switch: dict[int, set[int]] = {}     # dpid -> Lark meter ids we know to exist there
        # dpid -> meters this process made or used for a registered job: only these are released when a group's
        # last job leaves; others (found at start) wait for reconcile(), after every larkd had time to resync.
        self.used: dict[int, set[int]] = {}
        self.counters = LimitCounters()
        self._lock = threading.Lock()

    # -- wire --------------------------------------------------------------------------------------------
    def _want(self) -> dict[int, tuple[int, int]]:
        """Every meter the config can need: id -> (rate kbit/s, burst kbit) on its port."""
        out = {}
        for g, grp in enumerate(self.plan.groups):
            for p in range(max(1, len(self.plan.wan_ports))):
                port = self.plan.port_name(p)
                out[meter_id(g, p)] = (grp.rate_kbps(port), grp.burst_kbit(port))
        return out

    def _meter_mod(self, dp, command: int, mid: int):
        p, o = dp.ofproto_parser, dp.ofproto
        if command == o.OFPMC_DELETE:
            return p.OFPMeterMod(dp, command=command, flags=0, meter_id=mid, bands=[])
        rate, burst = self._want()[mid]
        band = p.OFPMeterBandDrop(rate=rate, burst_size=burst)
        return p.OFPMeterMod(dp, command=command, flags=o.OFPMF_KBPS | o.OFPMF_BURST | o.OFPMF_STATS,
                             meter_id=mid, bands=[band])

    def _timeout(self) -> float:
        return max(self.app.cfg.barrier_timeout, 5.0)

    def switch_meters(self, sw) -> dict[int, tuple[int, int]]:
        """Lark's meters on the switch: id -> (rate kbit/s, burst kbit) of its first band."""
        dp = sw.dp
        p, o = dp.ofproto_parser, dp.ofproto
        out = {}
        for reply in self.app._request(dp, p.OFPMeterConfigStatsRequest(dp, 0, o.OFPM_ALL), self._timeout()):
            for m in reply.body:
                if is_lark_meter(m.meter_id):
                    band = m.bands[0] if m.bands else None
                    out[m.meter_id] = (band.rate, band.burst_size) if band else (0, 0)
        return out

    def poll(self, sw) -> None:
        dp = sw.dp
        p, o = dp.ofproto_parser, dp.ofproto
        for reply in self.app._request(dp, p.OFPMeterStatsRequest(dp, 0, o.OFPM_ALL), self._timeout()):
            for m in reply.body:
                if is_lark_meter(m.meter_id):
                    self.counters.update(dp.id, meter_limit(m.meter_id), passed_bytes(m))

    def _send(self, sw, mods: list[tuple[int, int]]) -> None:
        """Meter mods then a barrier; an OpenFlow error names the meter, its group and port."""
        dp = sw.dp
        sent = {}
        for command, mid in mods:
            sent[self.app._send(dp, self._meter_mod(dp, command, mid))] = mid
        self.app._request(dp, dp.ofproto_parser.OFPBarrierRequest(dp), self.app.cfg.barrier_timeout)
        failed = [(mid, self.app._errors.pop((dp.id, xid))) for xid, mid in sent.items()
                  if (dp.id, xid) in self.app._errors]
        if failed:
            raise SwitchError(f"switch {dp.id:016x} refused meters " + "; ".join(
                f"{mid:#x} (group {self._group(mid)}): {e}" for mid, e in failed))

    def _group(self, mid: int) -> str:
        g, p = meter_limit(mid)
        name = self.plan.groups[g].name if 0 <= g < len(self.plan.groups) else "?"
        return name if p == 0 else f"{name} on {self.plan.port_name(p)}"

    # -- life cycle ---------------------------------------------------------------------------------------
    def needed(self) -> set[int]:
        return {meter_id(g, p) for g, p in self.app.registry.wan_limits_needed()}

    def ensure(self, sw, limits: set[tuple[int, int]]) -> None:
        """Create the meters the next flows name, before those flows (a flow naming a missing meter is refused)."""
        self._ensure(sw, {meter_id(g, p) for g, p in limits})

    def _ensure(self, sw, meters: set[int]) -> None:
        o = sw.dp.ofproto
        with self._lock:
            have = self.on_switch.setdefault(sw.dp.id, set())
            missing = sorted(meters - have)
            self.used.setdefault(sw.dp.id, set()).update(meters)
            if missing:
                self._send(sw, [(o.OFPMC_ADD, m) for m in missing])
                have.update(missing)
                log.info("switch %016x: created WAN meters %s", sw.dp.id,
                         ", ".join(f"{m:#x}={self._group(m)}" for m in missing))

    def classify(self) -> None:
        """Meters classify by their flows alone."""

    def release(self, sw, everything: bool = False) -> None:
        """After flows were removed: delete Lark's meters no registered job needs (a group's last job left);
        everything=True also those found on the switch at start (reconciliation, after the grace period)."""
        o = sw.dp.ofproto
        with self._lock:
            have = self.on_switch.setdefault(sw.dp.id, set())
            used = self.used.setdefault(sw.dp.id, set())
            unused = sorted((have if everything else have & used) - self.needed())
            used.difference_update(unused)
            if unused:
                self._send(sw, [(o.OFPMC_DELETE, m) for m in unused])
                have.difference_update(unused)
                for m in unused:
                    self.counters.forget(sw.dp.id, meter_limit(m))
                log.info("switch %016x: deleted WAN meters %s (no job of the group left)", sw.dp.id,
                         ", ".join(f"{m:#x}" for m in unused))

    def switch_up(self, sw) -> None:
        """A (re)connected switch: learn Lark's meters there, fix rates changed in the config, create missing
        ones for registered jobs. Unused ones are removed by reconcile() once larkds had time to resync."""
        o = sw.dp.ofproto
        on = self.switch_meters(sw)
        want = self._want()
        with self._lock:
            self.on_switch[sw.dp.id] = set(on)
        changed = [m for m, conf in on.items() if m in want and conf != want[m]]
        if changed:
            self._send(sw, [(o.OFPMC_MODIFY, m) for m in changed])
            log.info("switch %016x: re-rated WAN meters %s to the config", sw.dp.id, changed)
        orphans = [m for m in on if m not in want]   # meters of groups no longer configured: no flow may use them
        if orphans:
            self._send(sw, [(o.OFPMC_DELETE, m) for m in orphans])
            with self._lock:
                self.on_switch[sw.dp.id].difference_update(orphans)
        self._ensure(sw, self.needed())

    def reconcile(self, sw) -> None:
        self._ensure(sw, self.needed())
        self.release(sw, everything=True)

    def status(self) -> list[dict]:
        return self.counters.status(self.plan, self.app.registry.wan_limits_needed())
