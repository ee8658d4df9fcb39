"""Find and remove what no live job owns: namespaces, veths, firewall objects (of both backends), records,
address locks."""
from __future__ import annotations

import logging

from ..errors import LarkError
from ..kernel.firewall import Firewall, other_firewalls
from ..names import JobNames, is_job_key
from ..statefiles import remove_stale_temps
from . import peercred
from .jobnet import JobNetworker
from .resources import fw_job_keys
from .sandbox import SandboxLimiter

log = logging.getLogger(__name__)


def live_record_keys(net: JobNetworker) -> set[str]:
    """Records whose starter is still the same process: their jobs still run."""
    return {r.key for r in net.records.all() if peercred.alive(r.starter_pid, r.starter_start)}


def find_orphans(net: JobNetworker, keep: set[str], others: list[Firewall] | None = None) -> dict[str, list[str]]:
    cfg = net.cfg
    found: dict[str, list[str]] = {}

    def add(key: str, what: str) -> None:
        if key not in keep:
            found.setdefault(key, []).append(what)

    for key in net.records.keys():  # noqa: SIM118 (RecordStore.keys() lists the record files: not a dict)
        add(key, "record")
    # What any resource of a job still holds (lark/daemon/resources.py: the same list setup and teardown use),
    # then what the firewall backends this configuration does not use still hold.
    for key, whats in net.engine.keys().items():
        for what in whats:
            add(key, what)
    for fw in (other_firewalls(cfg) if others is None else others):
        for key in fw_job_keys(fw):
            add(key, f"{fw.name} rules")
    return found


def sweep_temps(net: JobNetworker, dry_run: bool) -> list[str]:
    dirs = [net.records.dir, net.finished.dir, net.leases.dir, *(p.dir for p in net.pools)]
    if dry_run:
        return []
    return [f"stale temp file {name}" for d in dirs for name in remove_stale_temps(d)]


def sweep(net: JobNetworker, keep: set[str], dry_run: bool = False,
          others: list[Firewall] | None = None, sandbox: SandboxLimiter | None = None) -> list[str]:
    """Remove every orphan; one orphan that cannot be removed does not stop the others (it is reported).
    `sandbox`: also the sandbox limits (cgroup, policers) of starters that are gone (sandbox.py)."""
    others = other_firewalls(net.cfg) if others is None else others
    other_keys = {fw.name: fw_job_keys(fw) for fw in others}
    actions = sweep_temps(net, dry_run)
    if sandbox is not None:
        actions += sandbox.sweep(dry_run)
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
            if not fw_job_keys(fw) and _base_present(fw):
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
