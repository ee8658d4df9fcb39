"""`lark machine-ad`: node-wide network figures as ClassAd attributes, for STARTD_CRON (the startd merges them
into the machine ad, so `condor_status -af LarkActiveJobs LarkBytesIn` answers without Prometheus)."""
from __future__ import annotations

import argparse
import logging

from ..errors import DaemonUnreachable
from ..job.client import call

log = logging.getLogger(__name__)


def attributes(totals: dict) -> dict[str, str]:
    """ClassAd attribute -> literal, from larkd's `totals` answer."""
    attrs = {"LarkDaemonUp": "true", "LarkActiveJobs": str(int(totals.get("active_jobs", 0))),
             "LarkBytesIn": str(int(totals.get("bytes_in", 0))), "LarkBytesOut": str(int(totals.get("bytes_out", 0)))}
    if totals.get("avail_bandwidth_mbit") is not None:
        attrs["LarkAvailBandwidth"] = f"{float(totals['avail_bandwidth_mbit']):g}"
    return attrs


def add_parser(sub) -> None:
    p = sub.add_parser("machine-ad", help="node totals as ClassAd attributes (for STARTD_CRON)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    try:
        attrs = attributes(call("totals", path=args.socket, timeout=10))
    except DaemonUnreachable as e:
        # Still an answer: the machine ad then says larkd is down, instead of keeping stale figures.
        log.warning("%s", e)
        attrs = {"LarkDaemonUp": "false", "LarkActiveJobs": "undefined"}
    for k, v in attrs.items():
        print(f"{k} = {v}")
    return 0
