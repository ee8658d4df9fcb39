"""Find and remove what no live job owns: namespaces, veths, firewall objects (of both backends), records,
address locks."""
from __future__ import annotations

import logging

from pyroute2 import IPRoute

from ..errors import LarkError
from ..kernel import dhcp6, dns6, links, netns
from ..kernel.firewall import Firewall, other_firewalls
from ..names import HOST_IF_PREFIX, JobNames, is_job_key, key_from_host_if
from ..statefiles import remove_stale_temps
from . import peercred
from .jobnet import JobNetworker

log = logging.getLogger(__name__)


def live_record_keys(net: JobNetworker) -> set[str]:
    """Records whose starter is still the same process: their jobs still run."""
    return {r.key for r in net.records.all() if peercred.alive(r.starter_pid, r.starter_start)}


def _keys_of(fw: Firewall) -> set[str]:
    try:
        return fw.job_keys()
    except LarkError as e:  # e.g. the other backend's tools are not installed: it cannot hold anything
        log.debug("no %s job objects to look at: %s", fw.name, e)
        return set()


def find_orphans(net: JobNetworker, keep: set[str], others: list[Firewall] | None = None) -> dict[str, list[str]]:
    cfg = net.cfg
    found: dict[str, list[str]] = {}

    def add(key: str, what: str) -> None:
        if key not in keep:
            found.setdefault(key, []).append(what)

    for key in net.records.keys():  # noqa: SIM118 (RecordStore.keys() lists the record files: not a dict)
        add(key, "record")
    for name in netns.list_named(cfg.netns_dir, cfg.netns_prefix):
        add(name[len(cfg.netns_prefix):], f"netns {name}")
    with IPRoute() as ipr:
        for ifname in links.list_links(ipr, HOST_IF_PREFIX):
            link_key = key_from_host_if(ifname)
            if link_key:
                add(link_key, f"link {ifname}")
    for fw in [net.fw, *(other_firewalls(cfg) if others is None else others)]:
        for key in _keys_of(fw):
            add(key, f"{fw.name} rules")
    for mode in net.modes.values():
        for key in mode.job_keys():
            add(key, f"{mode.name} port")
    for pool in net.pools:
        for item, owner in pool.entries():
            add(owner, f"{pool.what} lock {item}")
    # Daemons in a job's netns keep it alive after its name is gone; their directories name the job.
    for key in dhcp6.job_keys(cfg):
        add(key, "DHCPv6 client")
    for key in dns6.job_keys(cfg):
        add(key, "IPv6 DNS relay")
    return found


def sweep_temps(net: JobNetworker, dry_run: bool) -> list[str]:
    dirs = [net.records.dir, net.finished.dir, net.leases.dir, *(p.dir for p in net.pools)]
    if dry_run:
        return []
    return [f"stale temp file {name}" for d in dirs for name in remove_stale_temps(d)]


def sweep(net: JobNetworker, keep: set[str], dry_run: bool = False,
          others: list[Firewall] | None = None) -> list[str]:
    """Remove every orphan; one orphan that cannot be removed does not stop the others (it is reported)."""
    others = other_firewalls(net.cfg) if others is None else others
    other_keys = {fw.name: _keys_of(fw) for fw in others}
    actions = sweep_temps(net, dry_run)
    for key, whats in sorted(find_orphans(net, keep, others).items()):
        action = f"{key}: " + ", ".join(whats)
        if not dry_run:
            log.warning("removing orphaned objects of %s: %s", key, ", ".join(whats))
            failed = _remove(net, others, other_keys, key)
            if failed:
                action += f" (incomplete: {failed}; run gc again once fixed)"
        actions.append(action)
    if not dry_run:
        for fw in others:
            if not _keys_of(fw) and _base_present(fw):
                try:
                    fw.destroy_base()
                    actions.append(f"base {fw.name} objects (firewall is {net.fw.name})")
                except LarkError as e:
                    actions.append(f"base {fw.name} objects (incomplete: {e})")
    return actions


def _base_present(fw: Firewall) -> bool:
    try:
        return fw.base_present()
    except LarkError:
        return False


def _remove(net: JobNetworker, others: list[Firewall], other_keys: dict[str, set[str]], key: str) -> str:
    failed = []
    if is_job_key(key):
        try:
            net.teardown(key, "orphaned")
        except LarkError as e:
            failed.append(str(e))
        for fw in others:
            if key in other_keys[fw.name]:
                try:
                    fw.remove_job(JobNames(key, net.cfg.netns_prefix))
                except LarkError as e:
                    failed.append(f"{fw.name}: {e}")
    # Locks whose owner key is not a valid name cannot be found by teardown; drop them by item.
    for pool in net.pools:
        for item, owner in pool.entries():
            if owner == key:
                pool.drop(item)
    return "; ".join(failed)
