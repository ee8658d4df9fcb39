"""Lark: per-job networks for HTCondor."""

__version__ = "0.1.0"
PROTOCOL_VERSION = 1
