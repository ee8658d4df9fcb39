#!/usr/bin/env python3
"""Lark callout: map the job's RequestedVLAN name ("physics") to the VLAN id the site uses.

stdin: the job ad, a line "------", the machine ad (old ClassAd format). stdout: `VLAN = <id>` when the job
asked for a known VLAN name; nothing otherwise. Unknown names exit 1, which fails the job's setup with this
callout's name and message (the job is not run on the wrong network).

Table: /etc/lark/vlans.toml (`physics = 100`), or $LARK_VLAN_TABLE; built-in example when neither exists.
Standard library only, so it runs under any Python 3.11+.
"""
import os
import re
import sys
import tomllib

EXAMPLE = {"physics": 100, "chemistry": 200}


def table() -> dict:
    path = os.environ.get("LARK_VLAN_TABLE", "/etc/lark/vlans.toml")
    if os.path.exists(path):
        with open(path, "rb") as f:
            return {str(k): int(v) for k, v in tomllib.load(f).items()}
    return EXAMPLE


def main() -> int:
    job_text = sys.stdin.read().split("\n------\n", 1)[0]
    m = re.search(r'^\s*RequestedVLAN\s*=\s*"([A-Za-z0-9_.-]{1,64})"\s*$', job_text, re.M | re.I)
    if not m:
        return 0  # no named VLAN requested: leave the machine's VLAN as it is
    name = m.group(1)
    vlans = table()
    if name not in vlans:
        print(f"unknown VLAN name {name!r}; known: {', '.join(sorted(vlans))}", file=sys.stderr)
        return 1
    print(f"VLAN = {vlans[name]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
