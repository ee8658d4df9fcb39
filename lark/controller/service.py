"""What the API calls: the registry plus the OpenFlow app, with the answers larkd acts on."""
from __future__ import annotations

import logging
import os
import secrets
import time
from typing import Any

from . import hairpin, ofapp
from .config import ControllerConfig
from .flows import base_flows
from .model import JobReg
from .pipeline import WAN_DROP
from .registry import Registry

log = logging.getLogger("lark.controller")


def _rss_kib() -> int:
    with open(f"/proc/{os.getpid()}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


class Controller:
    def __init__(self, cfg: ControllerConfig, registry: Registry):
        self.cfg = cfg
        self.registry = registry
        self.started = time.time()
        # This process's boot id, in every API answer (header X-Lark-Boot): an EP that sees it change knows the
        # controller restarted with an empty registry and resyncs it at once (HA model, docs/controller.md).
        self.boot = secrets.token_hex(8)

    @property
    def app(self) -> ofapp.LarkSwitchApp | None:
        return ofapp.INSTANCE

    def _push(self, install, remove) -> dict:
        if self.app is None:
            return {"switches": 0, "flows": 0, "removed": 0, "errors": ["the OpenFlow application is not running"]}
        return self.app.apply(install, remove)

    def register(self, job: JobReg) -> tuple[int, dict]:
        entry, ch = self.registry.register(job)
        res = self._push(ch.install, ch.remove)
        d = entry.decision
        body = {"job_id": job.job_id, "cookie": f"{entry.cookie:#018x}", "flows_per_switch": len(entry.flows),
                "switches": res["switches"], "blocked_by": d.blocked_by, "slice": d.slice_name,
                "wan_policy": d.wan_policy,
                # larkd takes a dropped or WAN-dropped job's DNS away: its forwarder is on the EP, before this switch
                "wan_drop": d.wan_action == WAN_DROP}
        if entry.label is not None:   # [labels] mode = "vlan": the EP tags the job's frames with it
            body["label"] = {"vid": entry.label[0], "pcp": entry.label[1]}
        if res["errors"] or not res["switches"]:
            # The job stays registered (a switch that connects later gets its flows); larkd decides whether a
            # job may start without them (controller_failure).
            why = "; ".join(res["errors"]) or "no switch is connected to the controller"
            log.error("job %s: flows not acknowledged: %s", job.name, why)
            return 503, {**body, "error": f"job {job.job_id}: flows not on the switch: {why}"}
        log.info("registered job %s: cookie %#x, %d flows on %d switches (blocked_by=%s slice=%s wan=%s)",
                 job.name, entry.cookie, len(entry.flows), res["switches"], d.blocked_by or "-",
                 d.slice_name or "-", d.wan_policy or "-")
        return 200, body

    def unregister(self, ep: str, key: str) -> tuple[int, dict]:
        entry = self.registry.unregister(ep, key)
        if entry is None:
            return 200, {"removed": False}  # idempotent: teardown may repeat
        res = self._push([], [entry])
        log.info("unregistered job %s: removed cookie %#x from %d switches", entry.job.name, entry.cookie,
                 res["switches"])
        if res["errors"]:
            return 503, {"removed": True, "error": "; ".join(res["errors"])}
        return 200, {"removed": True, "switches": res["switches"]}

    def sync(self, ep: str, jobs: list[JobReg]) -> tuple[int, dict]:
        ch = self.registry.sync(ep, jobs)
        res: dict[str, Any] = (self._push(ch.install, ch.remove) if (ch.install or ch.remove)
                               else {"switches": 0, "errors": []})
        if ch.install or ch.remove:
            log.info("resync from %s: %d jobs, %d (re)installed, %d removed", ep, len(jobs), len(ch.install),
                     len(ch.remove))
        code = 503 if res["errors"] else 200
        return code, {"jobs": len(jobs), "installed": len(ch.install), "removed": len(ch.remove),
                      **({"error": "; ".join(res["errors"])} if res["errors"] else {})}

    def health(self) -> dict:
        """What an EP's health poll reads (GET /v1/health): the boot id and how many switches are ready."""
        app = self.app
        ready = sum(1 for sw in list(app.switches.values()) if sw.ready.is_set()) if app is not None else 0
        return {"boot": self.boot, "switches": ready}   # nothing about other EPs' jobs

    def status(self, ep: str | None = None) -> dict:
        """Everything, for an admin (`ep` None); for an EP only its own jobs: the owners, addresses and policies of
        other EPs' jobs, the switches and the WAN groups' traffic are not its business."""
        entries = self.registry.entries()
        if ep is not None:
            mine = [e for e in entries if e.job.ep == ep]
            return {"jobs": [e.summary() for e in mine], "attributes": self.cfg.attributes,
                    "totals": {"jobs": len(mine), "job_flows": sum(len(e.flows) for e in mine), "eps": [ep]}}
        app = self.app
        switches = []
        if app is not None:
            for dpid, sw in list(app.switches.items()):
                switches.append({"dpid": f"{dpid:016x}", "address": str(sw.dp.address[0]),
                                 "connected": sw.connected, "ready": sw.ready.is_set(),
                                 "wan_ports": {p: sw.ports.get(p) for p in self.cfg.wan_ports},
                                 "last_reconcile": app.last_reconcile.get(dpid)})
        job_flows = sum(len(e.flows) for e in entries)
        base = len(base_flows(self.cfg)) + len(hairpin.base_flows(self.cfg))
        return {"jobs": [e.summary() for e in entries], "switches": switches,
                "totals": {"jobs": len(entries), "job_flows": job_flows, "base_flows": base,
                           "flows_per_switch": job_flows + base,
                           "eps": sorted({e.job.ep for e in entries})},
                "uptime": time.time() - self.started, "rss_kib": _rss_kib(), "boot": self.boot,
                "attributes": self.cfg.attributes,
                "wan_groups": app.wan.status() if app is not None and getattr(app, "wan", None) is not None else []}
