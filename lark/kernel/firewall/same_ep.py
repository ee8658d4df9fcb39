"""Same-EP frames up the uplink (`bridge_isolate_jobs`): an isolated bridge port forwards nothing to another job's
port, but it does not send such a frame to the uplink either: the bridge knows where the other job's MAC is and
drops the frame there (verified on kernel 6.18). So, before the bridge sees it, a frame from a job port to the MAC
of another job on this EP is sent straight out of the uplink (nftables netdev ingress, `fwd`), where the pool's core
switch applies its policies and hairpins it back (lark.controller.hairpin). Every other frame takes the bridge as
before.

Per job, in the netdev table of Lark's table name: a base chain on the job's host-side device (ingress), an
allowlist chain (the bridge table's own anti-spoofing rules, `bridge_allowlist`, with "accept" turned into
"count and send up"), one element in the set of this EP's job MACs, and the job's `_out` counter (read and removed
with the job's other counters by the nftables driver). Constant per job; nothing per pair of jobs.
"""
from __future__ import annotations

import json
import logging

from ...errors import LarkError
from ...plan import JobNetwork
from ..drift import Finding
from . import libnft, nftverify
from .nftables import _meta, bridge_allowlist

log = logging.getLogger(__name__)

SET = "same_ep_jobs"
CHAIN, UP = "hp", "hpf"       # per-job chain suffixes (the nftables driver's JOB_CHAINS lists them for teardown)


def job_cmds(table: str, uplink: str, host_if: str, nft_id: str, mac: str, plan: JobNetwork) -> list[dict]:
    """The nft JSON commands that send the job's frames for other jobs of this EP out of `uplink`."""
    t = {"family": "netdev", "table": table}
    base, up, counter = f"{nft_id}_{CHAIN}", f"{nft_id}_{UP}", f"{nft_id}_out"
    cmds: list[dict] = [
        {"add": {"table": {"family": "netdev", "name": table}}},
        {"add": {"set": {**t, "name": SET, "type": "ether_addr"}}},
        {"add": {"counter": {**t, "name": counter}}},
        {"add": {"chain": {**t, "name": base, "type": "filter", "hook": "ingress", "dev": host_if,
                           "prio": -500, "policy": "accept"}}},
        {"flush": {"chain": {**t, "name": base}}},
        {"add": {"chain": {**t, "name": up}}},
        {"flush": {"chain": {**t, "name": up}}},
        # Not for a job of this EP: on to the bridge, as without isolation.
        {"add": {"rule": {**t, "chain": base, "expr": [
            {"match": {"op": "!=", "left": {"payload": {"protocol": "ether", "field": "daddr"}},
                       "right": f"@{SET}"}}, {"accept": None}]}}},
        # Counted like the bridge table counts the job's frames (IP only), then straight out of the uplink.
        {"add": {"rule": {**t, "chain": up, "expr": [_meta("protocol", {"set": ["ip", "ip6"]}),
                                                      {"counter": counter}]}}},
        {"add": {"rule": {**t, "chain": up, "expr": [{"fwd": {"dev": uplink}}]}}},
    ]
    for rule in bridge_allowlist(plan, mac):   # what the job may send at all; allowed -> up, the rest dropped
        expr = [{"goto": {"target": up}} if e == {"accept": None} else e for e in rule]
        cmds.append({"add": {"rule": {**t, "chain": base, "expr": expr}}})
    cmds.append({"add": {"element": {**t, "name": SET, "elem": [mac]}}})
    return cmds


def verify_job(table: str, uplink: str, host_if: str, nft_id: str, mac: str, plan: JobNetwork) -> list[Finding]:
    """What job_cmds built for the job, read back (lark status --verify)."""
    return nftverify.verify_cmds(job_cmds(table, uplink, host_if, nft_id, mac, plan))


def apply(cmds: list[dict], what: str, job_id: str = "") -> None:
    rc, _, err = libnft.get().run(json.dumps({"nftables": cmds}))
    if rc != 0:
        raise LarkError(f"nft failed: {err.strip()[:500]}", job=job_id or None, obj=what,
                        fix="needs nftables netdev `fwd` (CONFIG_NFT_FWD_NETDEV); or set bridge_isolate_jobs = false")


def forget_mac(table: str, mac: str) -> bool:
    """Remove the job's MAC from the set (its chains and counter go with the driver's remove_job); safe to repeat."""
    rc, out, _ = libnft.get().run(f"list set netdev {table} {SET}")
    if rc != 0 or not out.strip():
        return False
    elems = [e for o in json.loads(out).get("nftables", []) if "set" in o for e in o["set"].get("elem", [])]
    if mac.lower() not in [str(e).lower() for e in elems]:
        return False
    apply([{"delete": {"element": {"family": "netdev", "table": table, "name": SET, "elem": [mac]}}}],
          f"nft set netdev {table} {SET}")
    return True
