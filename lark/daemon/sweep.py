"""Find and remove what no live job owns: namespaces, veths, firewall objects, records, address locks."""
from __future__ import annotations

import logging
import re

from pyroute2 import IPRoute

from ..kernel import links, netns
from . import peercred
from .jobnet import JobNetworker
from ..names import HOST_IF_PREFIX, key_from_host_if
from .records import remove_stale_temps

log = logging.getLogger(__name__)
SAFE_KEY = re.compile(r"^[A-Za-z0-9_]{1,32}$")


def live_record_keys(net: JobNetworker) -> set[str]:
    """Records whose starter is still the same process: their jobs still run."""
    return {r.key for r in net.records.all() if peercred.alive(r.starter_pid, r.starter_start)}


def find_orphans(net: JobNetworker, keep: set[str]) -> dict[str, list[str]]:
    cfg = net.cfg
    found: dict[str, list[str]] = {}

    def add(key: str, what: str) -> None:
        if key not in keep:
            found.setdefault(key, []).append(what)

    for key in net.records.keys():
        add(key, "record")
    for name in netns.list_named(cfg.netns_dir, cfg.netns_prefix):
        add(name[len(cfg.netns_prefix):], f"netns {name}")
    with IPRoute() as ipr:
        for ifname in links.list_links(ipr, HOST_IF_PREFIX):
            key = key_from_host_if(ifname)
            if key:
                add(key, f"link {ifname}")
    for key in net.fw.job_keys():
        add(key, f"{net.fw.name} rules")
    for mode in net.modes.values():
        for key in mode.job_keys():
            add(key, f"{mode.name} port")
    for pool in net.pools:
        for item, owner in pool.entries():
            add(owner, f"{pool.what} lock {item}")
    return found


def sweep_temps(net: JobNetworker, dry_run: bool) -> list[str]:
    dirs = [net.records.dir, *(p.dir for p in net.pools)]
    if dry_run:
        return []
    return [f"stale temp file {name}" for d in dirs for name in remove_stale_temps(d)]


def sweep(net: JobNetworker, keep: set[str], dry_run: bool = False) -> list[str]:
    actions = sweep_temps(net, dry_run)
    for key, whats in sorted(find_orphans(net, keep).items()):
        actions.append(f"{key}: " + ", ".join(whats))
        if not dry_run:
            log.warning("removing orphaned objects of %s: %s", key, ", ".join(whats))
            if SAFE_KEY.fullmatch(key):
                net.teardown(key, "orphaned")
            # Locks whose owner key is not a valid name cannot be found by teardown; drop them by item.
            for pool in net.pools:
                for item, owner in pool.entries():
                    if owner == key:
                        pool.drop(item)
    return actions
