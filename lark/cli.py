"""`lark`: status, gc, doctor for admins."""
from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from typing import TYPE_CHECKING

from .config import load
from .errors import DaemonUnreachable, LarkError
from .job.client import call

if TYPE_CHECKING:   # the daemon and kernel modules are imported where a command needs them
    from .daemon.jobnet import JobNetworker
    from .daemon.sandbox import SandboxLimiter
    from .kernel.firewall.base import Firewall

log = logging.getLogger("lark")


def _rate(bps: float | None) -> str:
    if not bps:
        return "0"
    for unit, div in (("Gbit/s", 1e9), ("Mbit/s", 1e6), ("kbit/s", 1e3)):
        if bps >= div:
            return f"{bps / div:.1f} {unit}"
    return f"{bps:.0f} bit/s"


def cmd_status(args) -> int:
    if args.verify:
        return verify_status(args)
    answer = call("status", path=args.socket, timeout=10)
    jobs = answer["jobs"]
    if args.json:
        print(json.dumps(jobs, indent=2, sort_keys=True))
        return 0
    print(f"{'slot':<12} {'job':<10} {'mode':<6} {'address':<15} {'limit':>12} {'bytes in':>12} {'bytes out':>12} "
          f"{'avg in':>12} {'avg out':>12} {'peak in':>12} {'peak out':>12}")
    for j in jobs:
        plan, usage = j.get("plan", {}), j.get("usage") or {}
        limit = plan.get("rate_limit_mbit")
        print(f"{j.get('slot', ''):<12} {j.get('job_id', ''):<10} {plan.get('network_type', ''):<6} "
              f"{plan.get('ipv4') or '-':<15} {_rate(limit * 1e6) if limit else 'unlimited':>12} "
              f"{usage.get('bytes_in', 0):>12} {usage.get('bytes_out', 0):>12} "
              f"{_rate(usage.get('avg_in_bps')):>12} {_rate(usage.get('avg_out_bps')):>12} "
              f"{_rate(usage.get('peak_in_bps')):>12} {_rate(usage.get('peak_out_bps')):>12}")
    if not jobs:
        print("(no networked jobs)")
    return 0


def verify_status(args) -> int:
    """Each running job's kernel objects against larkd's record of them; exit status 1 on any drift."""
    answer = call("verify", path=args.socket, timeout=120)
    drift = answer["drift"]
    if args.json:
        print(json.dumps({k: answer[k] for k in ("jobs", "objects", "not_ready", "drift")}, indent=2, sort_keys=True))
        return 1 if drift else 0
    if not drift:
        print(f"no drift: {answer['jobs']} running job(s), {answer['objects']} kernel objects as their records say"
              + (f" ({answer['not_ready']} slot(s) setting up or tearing down, not checked)" if answer["not_ready"]
                 else ""))
        return 0
    print(f"{'job':<10} {'slot':<12} {'object':<48} problem")
    for row in drift:
        print(f"{row['job']:<10} {row['slot']:<12} {row['object']:<48} {row['problem']}")
        print(f"{'':<10} {'':<12} {'':<48} fix: {row['fix']}")
    print(f"{len(drift)} object(s) drifted from their records, in {len({r['job'] for r in drift})} of "
          f"{answer['jobs']} running job(s)", file=sys.stderr)
    return 1


def cmd_gc(args) -> int:
    purge_refused = False
    try:
        answer = call("gc", path=args.socket, timeout=120, dry_run=args.dry_run)
        actions = answer["actions"]
        purge_refused = args.purge and not args.dry_run
    except DaemonUnreachable:
        actions = _offline_gc(args)
    verb = "would remove" if args.dry_run else "removed"
    for a in actions:
        print(f"{verb} {a}")
    if not actions:
        print("nothing to remove")
    if any("(incomplete" in a for a in actions):
        print("lark gc: some objects were not removed (see 'incomplete' above); fix the cause and run it again",
              file=sys.stderr)
        return 1
    if purge_refused:
        # larkd swept its orphans; the shared objects (base rules, the sandbox limiter's table and cgroup parent)
        # are its own while it runs.
        print("lark gc: --purge needs larkd stopped: larkd swept what it could, the shared objects stay (stop larkd, "
              "e.g. `condor_off -daemon LARKD`, then run `lark gc --purge` again)", file=sys.stderr)
        return 1
    return 0


def _purge_steps(fw: Firewall, sandbox: SandboxLimiter, net: JobNetworker) -> list[str]:
    """`lark gc --purge`'s shared objects, each step on past the others' errors (a failure is an action that
    says "incomplete", which makes gc exit 1)."""
    def base() -> list[str]:
        fw.destroy_base()
        return [f"base {fw.name} objects"]

    def dns() -> list[str]:
        return ["DNS forwarder"] if net.dns.stop() else []

    actions: list[str] = []
    for what, step in (("base firewall objects", base), ("sandbox limiter", sandbox.purge), ("DNS forwarder", dns)):
        try:
            actions += step()
        except (LarkError, OSError) as e:
            actions.append(f"{what} (incomplete: {e})")
    return actions


def _offline_gc(args) -> list[str]:
    """larkd is down: sweep here, holding its lock so it cannot start halfway through."""
    from .daemon.jobnet import JobNetworker
    from .daemon.records import FinishedStore, RecordStore
    from .daemon.sandbox import SandboxLimiter
    from .daemon.server import hold_daemon_lock
    from .daemon.sweep import live_record_keys, sweep
    from .kernel.accounting import Accountant
    from .kernel.firewall import make_firewall

    cfg = load(args.config)
    lock = hold_daemon_lock(cfg)
    try:
        fw = make_firewall(cfg)
        net = JobNetworker(cfg, fw, RecordStore(cfg.records_dir), Accountant(fw),
                           FinishedStore(os.path.join(cfg.state_dir, "finished"), cfg.finished_keep))
        sandbox = SandboxLimiter(cfg)
        actions = sweep(net, live_record_keys(net), args.dry_run, sandbox=sandbox)
        if args.purge and not args.dry_run and not net.records.keys():
            actions += _purge_steps(fw, sandbox, net)
        return actions
    finally:
        os.close(lock)


def cmd_policy_explain(args) -> int:
    from .config import Config
    from .names import job_key
    from .policy.classads import read_ad
    from .policy.engine import decide

    cfg = load(args.config) if args.config else Config()
    if args.callout is not None:
        cfg.callout = args.callout
    from .daemon.metrics import machine_mbit
    # The uplink's speed as larkd reads it at start: the fair share's capacity when nothing else gives one.
    plan = decide(read_ad(args.job), read_ad(args.machine), cfg, args.slot, job_key(args.slot),
                  uplink_mbit=machine_mbit(cfg))
    fields = ["network_type", "inbound", "outbound", "accounting", "ip_protocol", "address_type",
              "request_bandwidth_mbit", "rate_limit_mbit", "vlan"]
    sources = {"ip_protocol": "ip_protocol", "vlan": "vlan"}
    if args.json:
        print(json.dumps({"plan": {f: getattr(plan, f) for f in fields}, "decided_by": plan.decided_by},
                         indent=2, sort_keys=True))
        return 0
    print(f"job {plan.job_id} on {args.slot}:")
    print(f"{'field':<24} {'value':<10} decided by")
    for f in fields:
        print(f"{f:<24} {getattr(plan, f)!s:<10} {plan.decided_by.get(sources.get(f, f), '')}")
    return 0


def cmd_detect_bandwidth(args) -> int:
    from .kernel.linkspeed import detect
    cfg = load(args.config)
    mbit = detect(args.interface or cfg.uplink, cfg.bandwidth_mbit)
    # The format HTCondor's MACHINE_RESOURCE_INVENTORY_<name> expects.
    print(f"DetectedBandwidth = {mbit}")
    return 0


def cmd_network_types(args) -> int:
    """What the starter wrapper advertises as LarkNetworkTypes: it runs this, as it runs the real starter, so
    the job's side (lark/job/) imports neither the configuration nor the kernel code."""
    from .kernel.attach import available_types
    print(",".join(available_types(load(args.config, warn=False))))
    return 0


def cmd_doctor(args) -> int:
    from . import doctor
    cfg = load(args.config)
    text, missing = doctor.report(doctor.run(), cfg.firewall)
    print(text)
    from . import hostcheck
    platform_text, to_fix = hostcheck.report(hostcheck.check(cfg))
    print(platform_text)
    if to_fix:
        print(f"{to_fix} platform finding(s) need the admin (see fix:)", file=sys.stderr)
    if missing:
        print(f"{missing} required feature(s) missing: Lark cannot network jobs here", file=sys.stderr)
    return 1 if missing else 0


def cmd_config_migrate(args) -> int:
    """The LARK_* lines equivalent to a TOML file (default: the deprecated /etc/lark/lark.toml)."""
    from . import config
    path = args.config or config.DEFAULT_PATH
    cfg = config.load(path, warn=False)
    lines = config.knob_lines(cfg)
    print(f"# LARK_* knobs equivalent to {path} (values that differ from the defaults); put them in a file")
    print("# under /etc/condor/config.d/, run condor_reconfig, then delete the TOML file.")
    print("\n".join(lines) if lines else "# (every value is the default: nothing to set)")
    return 0


def cmd_config_knobs(args) -> int:
    from . import config
    print(config.knob_table(), end="")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="lark", description="Lark per-job networks: admin tool")
    ap.add_argument("--config", help="a TOML config file (deprecated) instead of HTCondor's LARK_* knobs")
    ap.add_argument("--socket", help="larkd socket (default from config)")
    ap.add_argument("--log-level", default="WARNING")
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("status", help="networked jobs, addresses, bytes and rates")
    p.add_argument("--json", action="store_true")
    p.add_argument("--verify", action="store_true", help="compare every running job's kernel objects with its "
                   "record and list the drift (exit status 1 on any)")
    p.set_defaults(func=cmd_status)
    p = sub.add_parser("gc", help="remove objects no live job owns (safe to repeat)")
    p.add_argument("--dry-run", action="store_true", help="only list what would be removed")
    p.add_argument("--purge", action="store_true", help="with larkd stopped and no jobs: also remove base rules")
    p.set_defaults(func=cmd_gc)
    p = sub.add_parser("policy", help="network policy tools")
    psub = p.add_subparsers(dest="policy_cmd", required=True)
    e = psub.add_parser("explain", help="the plan a job would get on a machine, and what decided each field")
    e.add_argument("--job", required=True, help="job ad: .job.ad, condor_q -l output, old or new format")
    e.add_argument("--machine", required=True, help="machine/slot ad: .machine.ad, condor_status -l output")
    e.add_argument("--slot", default="slot1")
    e.add_argument("--callout", help="run this callout (default: the one in the config)")
    e.add_argument("--json", action="store_true")
    e.set_defaults(func=cmd_policy_explain)
    p = sub.add_parser("detect-bandwidth", help="print DetectedBandwidth = <Mbit/s> of the uplink")
    p.add_argument("--interface", help="default: uplink from the config")
    p.set_defaults(func=cmd_detect_bandwidth)
    p = sub.add_parser("network-types", help="print the network types this machine's configuration offers")
    p.set_defaults(func=cmd_network_types)
    p = sub.add_parser("doctor", help="kernel and tool features Lark needs or can use")
    p.set_defaults(func=cmd_doctor)
    from .report.command import add_parser as add_report_parser
    from .report.machine_ad import add_parser as add_machine_ad_parser
    add_report_parser(sub)
    add_machine_ad_parser(sub)
    from .hook_launcher import add_parser as add_install_hook_parser
    add_install_hook_parser(sub)
    p = sub.add_parser("config", help="configuration tools")
    csub = p.add_subparsers(dest="config_cmd", required=True)
    c = csub.add_parser("migrate", help="print the LARK_* knob lines equivalent to a lark.toml (--config FILE)")
    c.set_defaults(func=cmd_config_migrate)
    c = csub.add_parser("knobs", help="every LARK_* knob with its default, as a markdown table")
    c.set_defaults(func=cmd_config_knobs)
    args = ap.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="lark: %(levelname)s %(message)s")
    if args.socket is None and args.cmd not in ("policy", "config", "report", "network-types", "install-hook"):
        try:  # larkd's socket as its configuration says (LARK_SOCKET, or the --config file)
            args.socket = load(args.config, warn=False).socket
        except LarkError as e:
            log.warning("configuration unreadable, using the default socket: %s", e)
    try:
        return args.func(args)
    except LarkError as e:
        print(f"lark: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
