"""SIGHUP: read the configuration again and apply what can change while jobs run.

condor_reconfig makes condor_master send SIGHUP to the daemons in DAEMON_LIST (systemd: `systemctl reload`).
Fields read afresh on every use change at once; the rest (paths, pools, the firewall backend, the bridge) are
baked into kernel objects and running jobs, so a change to them is logged as needing a restart.
"""
from __future__ import annotations

import dataclasses
import logging

from ..config import LIVE_FIELDS, Config, knob_name, load

log = logging.getLogger(__name__)


def apply(cfg: Config, new: Config) -> tuple[list[str], list[str]]:
    """Copy the live fields of `new` into `cfg`; returns (what changed now, knobs that need a restart)."""
    applied, need_restart = [], []
    for f in dataclasses.fields(Config):
        old_value, new_value = getattr(cfg, f.name), getattr(new, f.name)
        if old_value == new_value:
            continue
        if f.name in LIVE_FIELDS:
            setattr(cfg, f.name, new_value)
            applied.append(f"{knob_name(f.name)} {old_value!r} -> {new_value!r}")
        else:
            need_restart.append(knob_name(f.name))
    return applied, need_restart


def reload(cfg: Config, config_path: str | None) -> tuple[list[str], list[str]]:
    """Re-read the same source larkd started from (a --config file, or HTCondor's configuration) and apply it.
    A configuration that does not validate changes nothing (LarkError, for the caller to log)."""
    if not config_path:
        import htcondor2
        htcondor2.reload_config()
    applied, need_restart = apply(cfg, load(config_path))
    for line in applied:
        log.info("configuration reloaded: %s", line)
    if need_restart:
        log.warning("configuration reloaded; these changes take effect when larkd restarts: %s",
                    ", ".join(need_restart))
    if not applied and not need_restart:
        log.info("configuration reloaded: nothing changed")
    return applied, need_restart
