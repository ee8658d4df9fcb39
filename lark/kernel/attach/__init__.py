"""Attach modes: how a job's veth meets the world. One small interface, one module per mode."""
from __future__ import annotations

import shutil

from ...config import Config
from .base import AttachMode
from .bridge import BridgeMode
from .nat import NatMode
from .ovs import OvsMode

# The attach modes this package has, by network type (make_modes makes those the configuration offers).
MODE_CLASSES: dict[str, type[AttachMode]] = {cls.name: cls for cls in (NatMode, BridgeMode, OvsMode)}


def available_types(cfg: Config) -> list[str]:
    """The network types this machine's configuration offers, without touching anything."""
    types = ["nat"]
    if cfg.bridge_range:
        types.append("bridge")
        if shutil.which("ovs-vsctl"):
            types.append("ovs_bridge")
    return [*types, "none"]


def make_modes(cfg: Config) -> dict[str, AttachMode]:
    """One attach mode per network type the configuration offers (available_types decides which), each given
    only its section of the configuration (lark/kernel/sections.py)."""
    modes: dict[str, AttachMode] = {}
    for t in available_types(cfg):
        if t in MODE_CLASSES:
            cls = MODE_CLASSES[t]
            modes[t] = cls(cls.section.from_config(cfg))
    return modes
