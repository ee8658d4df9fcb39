"""lark-hook: UPDATE_JOB_INFO and JOB_EXIT hooks. Push the job's traffic figures into its ad.

Runs as the job's user in the host netns, under the job's starter, so larkd answers `stats` for that slot
only. Values go in with `condor_chirp set_job_attr_delayed` (names covered by CHIRP_DELAYED_UPDATE_PREFIX)
and reach condor_history with the job's final update. The first UPDATE_JOB_INFO may run before
_CONDOR_CHIRP_CONFIG exists; then chirp fails and the next run tries again. Never fails the job.
"""
from __future__ import annotations

import logging
import os
import subprocess
import sys

from .client import call
from ..errors import LarkError

log = logging.getLogger("lark-hook")
CHIRP_CANDIDATES = ["/usr/libexec/condor/condor_chirp", "/usr/lib/condor/libexec/condor_chirp"]


def job_attributes(stats: dict) -> dict[str, str]:
    """ClassAd attribute name -> ClassAd literal, from larkd's stats answer."""
    usage = stats.get("usage") or stats.get("finished") or {}
    # An ended job's plan is gone with its record; its final summary keeps what the ad shows (a job shorter
    # than the first push would otherwise end without its type, address and the limit it ran under).
    plan = stats.get("plan") or {k: v for k, v in (stats.get("finished") or {}).items()
                                  if k in ("network_type", "ipv4", "rate_limit_mbit")}
    attrs: dict[str, str] = {}
    if plan:
        attrs["LarkNetworkType"] = f'"{plan.get("network_type", "")}"'
        if plan.get("ipv4"):
            attrs["LarkIPv4Address"] = f'"{plan["ipv4"]}"'
        if plan.get("ipv6"):
            attrs["LarkIPv6Address"] = f'"{plan["ipv6"]}"'
        if plan.get("inbound_port"):
            attrs["LarkInboundPort"] = str(int(plan["inbound_port"]))
        if plan.get("rate_limit_mbit"):
            attrs["LarkBandwidthLimit"] = f"{float(plan['rate_limit_mbit']):g}"
    if usage:
        for attr, key in (("NetworkIncomingBytes", "bytes_in"), ("NetworkOutgoingBytes", "bytes_out"),
                          ("NetworkIncomingPackets", "packets_in"), ("NetworkOutgoingPackets", "packets_out")):
            attrs[attr] = str(int(usage.get(key, 0)))
        for attr, key in (("NetworkIncomingAvgRate", "avg_in_bps"), ("NetworkOutgoingAvgRate", "avg_out_bps"),
                          ("NetworkIncomingPeakRate", "peak_in_bps"), ("NetworkOutgoingPeakRate", "peak_out_bps")):
            attrs[attr] = f"{float(usage.get(key, 0.0)):.1f}"
    return attrs


def chirp_path() -> str | None:
    for p in [os.environ.get("LARK_CONDOR_CHIRP", ""), *CHIRP_CANDIDATES]:
        if p and os.access(p, os.X_OK):
            return p
    return None


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=logging.WARNING, format="lark-hook: %(message)s")
    final = bool(argv and argv[0] == "exit")
    if not sys.stdin.isatty():
        sys.stdin.read()  # the starter writes the job ad to the hook's stdin; do not leave it blocked
    try:
        stats = call("stats", timeout=10, fresh=True)
    except LarkError as e:
        log.warning("no figures from larkd: %s", e)
        return 0
    chirp = chirp_path()
    if not chirp:
        log.warning("condor_chirp not found; set LARK_CONDOR_CHIRP")
        return 0
    for attr, value in job_attributes(stats).items():
        cp = subprocess.run([chirp, "set_job_attr_delayed", attr, value], capture_output=True, text=True, timeout=20)
        if cp.returncode != 0:
            log.warning("chirp %s failed%s: %s", attr, " (final)" if final else "", cp.stderr.strip()[:200])
            break
    return 0


if __name__ == "__main__":
    sys.exit(main())
