"""Attach modes: how a job's veth meets the world. One small interface, one module per mode."""
from __future__ import annotations

import shutil

from ..config import Config
from .base import AttachMode
from .bridge import BridgeMode
from .nat import NatMode
from .ovs import OvsMode


def make_modes(cfg: Config) -> dict[str, AttachMode]:
    modes: dict[str, AttachMode] = {"nat": NatMode(cfg)}
    if cfg.bridge_range:
        modes["bridge"] = BridgeMode(cfg)
        if shutil.which("ovs-vsctl"):
            modes["ovs_bridge"] = OvsMode(cfg)
    return modes
