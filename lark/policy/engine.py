"""Network policy: the job ad (Table I) and the slot ad (Table II) evaluated by the real ClassAd engine.

Machine attributes are evaluated with the slot ad as MY and the job ad as TARGET, so an admin can write
`NetworkType = ifThenElse(TARGET.OutboundConnectivity, ...)`. Every value is validated and normalised here;
the result is one NetworkPlan, and `decided_by` says which attribute or expression produced each field.
"""
from __future__ import annotations

import logging
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import classad2

from ..config import IFNAME_RE, Config
from ..errors import LarkError
from ..plan import NETWORK_TYPES, NetworkPlan
from ..scitags import Rule, parse_rules
from .transfers import check_transfer_plugins

log = logging.getLogger(__name__)
VLAN_NAME_RE = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
_MISSING = object()


@dataclass(frozen=True)
class Attr:
    name: str
    type: str
    default: Any
    doc: str


JOB_ATTRS = [
    Attr("IPProtocol", "string", "IPv4", "IP protocol the job wants: IPv4, IPv6 or IPv4+IPv6"),
    Attr("RequestBandwidth", "number (Mbit/s)", 0, "bandwidth the job asks to be guaranteed (request_bandwidth)"),
    Attr("NetworkAccounting", "boolean", True, "count the job's traffic and report it"),
    Attr("InboundConnectivity", "boolean", False, "others may open connections to the job"),
    Attr("OutboundConnectivity", "boolean", True, "the job may open connections out"),
    Attr("RequestedVLAN", "string or integer", None, "the VLAN (name or id) the job wants to run in"),
]


def _show(v: Any) -> str:
    if isinstance(v, frozenset):
        return "+".join(sorted(v))
    return "undefined" if v is None else str(v)


def with_job_defaults(job: classad2.ClassAd) -> classad2.ClassAd:
    """A copy of the job ad with Table I defaults filled in, so machine expressions over TARGET see them."""
    ad = classad2.ClassAd()
    ad.update(job)
    for a in JOB_ATTRS:
        if a.default is not None and a.name not in ad:
            ad[a.name] = a.default
    return ad


def _py(value: Any) -> Any:
    if isinstance(value, classad2.Value):
        return None if value == classad2.Value.Undefined else value
    return value


def evaluate(my: classad2.ClassAd, target: classad2.ClassAd, attr: str) -> tuple[Any, str]:
    """Evaluate MY.attr against TARGET; returns (python value or _MISSING, source text)."""
    expr = my.lookup(attr) if attr in my else None
    if expr is None:
        return _MISSING, ""
    try:
        value = _py(expr.eval(my, target))
    except (RuntimeError, ValueError, TypeError) as e:
        raise LarkError(f"evaluation failed: {e}", obj=f"attribute {attr} = {str(expr)[:200]}") from None
    if value is classad2.Value.Error:
        raise LarkError("evaluates to ERROR", obj=f"attribute {attr} = {str(expr)[:200]}",
                        fix="check the expression's types")
    return value, str(expr)


class _Decider:
    def __init__(self, job: classad2.ClassAd, machine: classad2.ClassAd, job_id: str,
                 overridden: set[str] | frozenset[str] = frozenset(), callout: str = ""):
        self.job, self.machine, self.job_id = job, machine, job_id
        self.overridden, self.callout = overridden, callout
        self.decided_by: dict[str, str] = {}
        self.fair_capacity: float | None = None  # default_bandwidth = fair: the link's capacity (Mbit/s)

    def _get(self, side: str, attr: str, default: Any, check: Callable[[Any, str], Any], field: str) -> Any:
        my, target = (self.job, self.machine) if side == "job" else (self.machine, self.job)
        try:
            value, src = evaluate(my, target, attr)
        except LarkError as e:  # say which job and which ad
            raise LarkError(e.what, job=self.job_id, obj=f"{side} {e.obj}", fix=e.fix) from None
        if value is _MISSING or value is None:
            self.decided_by.setdefault(field, f"default ({_show(default)})")
            return default
        where = f"{side} attribute {attr} = {src[:200]}"
        if side == "machine" and attr in self.overridden:
            where = f"callout {self.callout}: {attr} = {src[:200]}"
        try:
            out = check(value, attr)
        except LarkError as e:
            raise LarkError(f"{e.what}; it evaluated to {str(value)[:80]!r}", job=self.job_id, obj=where,
                            fix=e.fix) from None
        self.decided_by[field] = where
        return out

    def job_attr(self, attr, default, check, field=None):
        return self._get("job", attr, default, check, field or attr)

    def machine_attr(self, attr, default, check, field=None):
        return self._get("machine", attr, default, check, field or attr)


def as_bool(v: Any, attr: str) -> bool:
    if isinstance(v, bool):
        return v
    raise LarkError("must be a boolean", fix=f"write {attr} = true or false")


def as_number(v: Any, attr: str) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or v != v or v < 0 or v > 10_000_000:
        raise LarkError("must be a number of Mbit/s between 0 and 10000000", fix=f"write {attr} = 100")
    return float(v)


def as_network_type(v: Any, attr: str) -> str:
    if not isinstance(v, str):
        raise LarkError("must be a string", fix="use nat, bridge, ovs_bridge or none")
    t = v.strip().lower()
    t = {"null": "none", "": "none", "ovs": "ovs_bridge"}.get(t, t)
    if t not in NETWORK_TYPES:
        raise LarkError("is not a network type", fix="use nat, bridge, ovs_bridge or none")
    return t


def as_address_type(v: Any, attr: str) -> str:
    if not isinstance(v, str) or v.strip().lower() not in ("static", "dhcp"):
        raise LarkError("is not an address type", fix="use static or dhcp")
    return v.strip().lower()


def as_protocols(v: Any, attr: str) -> frozenset[str]:
    if not isinstance(v, str):
        raise LarkError("must be a string", fix="use IPv4, IPv6 or IPv4+IPv6")
    parts = {p.strip().lower() for p in re.split(r"[,+ ]+", v) if p.strip()}
    mapping = {"ipv4": "IPv4", "ipv6": "IPv6", "4": "IPv4", "6": "IPv6", "both": "both", "dual": "both"}
    if not parts or not parts <= set(mapping):
        raise LarkError("is not an IP protocol", fix="use IPv4, IPv6 or IPv4+IPv6")
    out = {mapping[p] for p in parts}
    if "both" in out:
        out = {"IPv4", "IPv6"}
    return frozenset(out)


def as_vlan(v: Any, attr: str) -> int | str:
    if isinstance(v, bool):
        raise LarkError("must be a VLAN id or name", fix="use 1-4094 or a name the callout maps")
    if isinstance(v, int):
        if 1 <= v <= 4094:
            return v
        raise LarkError("is not a VLAN id in 1-4094", fix="use 1-4094")
    if isinstance(v, str) and VLAN_NAME_RE.fullmatch(v):
        return int(v) if v.isdigit() and 1 <= int(v) <= 4094 else v
    raise LarkError("is not a VLAN id or a safe VLAN name", fix="names are letters, digits, _.- up to 64")


def as_ifname(v: Any, attr: str) -> str:
    if isinstance(v, str) and IFNAME_RE.fullmatch(v):
        return v
    raise LarkError("is not a valid interface name", fix="1-15 letters, digits, _.-")


def job_id_of(job: classad2.ClassAd) -> str:
    cluster, proc = job.get("ClusterId"), job.get("ProcId")
    if isinstance(cluster, int) and isinstance(proc, int):
        return f"{cluster}.{proc}"
    return "?"


def _string_or_empty(ad: classad2.ClassAd, attr: str) -> str:
    v = ad.get(attr)
    return v if isinstance(v, str) else ""


def _rate_limit(d: _Decider, cfg: Config, uplink_mbit: float | None) -> float | None:
    """The job's limit comes from what the startd allocated to its slot, never from what the job asked:
    matchmaking already checked the request against the machine, and the slot ad is not the user's to edit."""
    allocated = d.machine_attr("Bandwidth", None, as_number, "rate_limit_mbit")
    if allocated:
        d.decided_by["rate_limit_mbit"] = f"slot's allocated Bandwidth = {allocated:g}"
        return allocated
    policy = cfg.default_bandwidth
    if policy == "fair":
        return _fair_share(d, cfg, uplink_mbit)
    if policy == "unlimited":
        d.decided_by["rate_limit_mbit"] = "no Bandwidth allocated; default_bandwidth = unlimited"
        return None
    if policy == "share":
        total = d.machine_attr("TotalBandwidth", None, as_number, "_total_bw") or \
            d.machine_attr("DetectedBandwidth", None, as_number, "_total_bw")
        cpus = d.machine_attr("Cpus", None, as_number, "_cpus")
        total_cpus = d.machine_attr("TotalCpus", None, as_number, "_total_cpus")
        for f in ("_total_bw", "_cpus", "_total_cpus"):
            d.decided_by.pop(f, None)
        if not (total and cpus and total_cpus):
            raise LarkError("default_bandwidth = share needs TotalBandwidth (or DetectedBandwidth), Cpus and "
                            "TotalCpus in the slot ad", job=d.job_id, obj="slot ad",
                            fix="configure MACHINE_RESOURCE_INVENTORY_Bandwidth, or use a fixed default_bandwidth")
        share = total * min(cpus / total_cpus, 1.0)
        d.decided_by["rate_limit_mbit"] = (f"no Bandwidth allocated; default_bandwidth = share: "
                                           f"{total:g} x {cpus:g}/{total_cpus:g} cpus")
        return share
    d.decided_by["rate_limit_mbit"] = f"no Bandwidth allocated; default_bandwidth = {policy}"
    return float(policy)


def _fair_share(d: _Decider, cfg: Config, uplink_mbit: float | None) -> float | None:
    """No limit yet: larkd gives the job its share of what reserved jobs leave (lark/kernel/fairshare.py).

    The link's capacity: the slot ad's Bandwidth inventory, else the configured bandwidth_mbit, else the uplink's
    link speed larkd detected. A slot without an inventory (virtual NICs, where detection fails) still shares
    the link; with no figure at all the job is refused rather than run unlimited, which only the admin may
    choose (default_bandwidth = unlimited)."""
    capacity = d.machine_attr("TotalBandwidth", None, as_number, "_capacity") or \
        d.machine_attr("DetectedBandwidth", None, as_number, "_capacity")
    source = d.decided_by.pop("_capacity", "")
    if not capacity and cfg.bandwidth_mbit > 0:
        capacity, source = float(cfg.bandwidth_mbit), f"bandwidth_mbit = {cfg.bandwidth_mbit}"
    if not capacity and uplink_mbit:
        capacity, source = uplink_mbit, f"uplink {cfg.uplink}'s link speed"
    if not capacity:
        raise LarkError("default_bandwidth = fair, but no capacity is known to share: the slot ad has no "
                        "Bandwidth inventory, bandwidth_mbit is not set and the uplink reports no link speed",
                        job=d.job_id, obj=f"uplink {cfg.uplink}",
                        fix="set LARK_BANDWIDTH_MBIT to the uplink's capacity in Mbit/s, or LARK_DEFAULT_BANDWIDTH "
                            "= unlimited to run jobs without a reservation unlimited")
    d.fair_capacity = float(capacity)
    d.decided_by["rate_limit_mbit"] = (f"no Bandwidth allocated; default_bandwidth = fair: an equal share of what "
                                       f"reserved jobs leave of {capacity:g} ({source}), set when the job starts")
    return None


def decide(job: classad2.ClassAd, machine: classad2.ClassAd, cfg: Config, slot: str, key: str,
           uplink_mbit: float | None = None) -> NetworkPlan:
    """Evaluate the policy; with `cfg.callout` set, its output overrides machine attributes first.
    `uplink_mbit`: the uplink's detected link speed, the fair share's last resort for the link's capacity."""
    job_id = job_id_of(job)
    check_transfer_plugins(job, job_id)  # a submitter's own plugin would run with the EP's network: refused
    explicit = {a.name for a in JOB_ATTRS if a.name in job}
    job = with_job_defaults(job)
    overridden: set[str] = set()
    if cfg.callout:
        from .callout import apply_overrides, run_callout
        overrides = run_callout(cfg.callout, job, machine, cfg.callout_timeout, job_id)
        overridden = set(overrides.keys())
        machine = apply_overrides(machine, overrides)
    d = _Decider(job, machine, job_id, overridden, cfg.callout)
    inbound = d.job_attr("InboundConnectivity", False, as_bool, "inbound")
    outbound = d.job_attr("OutboundConnectivity", True, as_bool, "outbound")
    want_acct = d.job_attr("NetworkAccounting", True, as_bool, "accounting")
    have_acct = d.machine_attr("NetworkAccounting", True, as_bool, "machine_accounting")
    request_bw = d.job_attr("RequestBandwidth", 0.0, as_number, "request_bandwidth_mbit")
    job_proto = d.job_attr("IPProtocol", frozenset({"IPv4"}), as_protocols, "ip_protocol")
    machine_proto = d.machine_attr("IPProtocol", frozenset({"IPv4"}), as_protocols, "machine_ip_protocol")
    network_type = d.machine_attr("NetworkType", cfg.default_network_type, as_network_type, "network_type")
    address_type = d.machine_attr("AddressType", "static", as_address_type, "address_type")
    requested_vlan = d.job_attr("RequestedVLAN", None, as_vlan, "requested_vlan")
    vlan = d.machine_attr("VLAN", None, as_vlan, "vlan")
    for attr in ("BridgeInterface", "ExternalInterface", "InternalInterface"):
        d.machine_attr(attr, None, as_ifname, attr)  # validated now: these later become device names
    for a in JOB_ATTRS:  # defaults were filled in for evaluation; say so instead of naming the filled value
        field = {"InboundConnectivity": "inbound", "OutboundConnectivity": "outbound",
                 "NetworkAccounting": "accounting", "RequestBandwidth": "request_bandwidth_mbit",
                 "IPProtocol": "ip_protocol", "RequestedVLAN": "requested_vlan"}[a.name]
        if a.name not in explicit and field in d.decided_by:
            d.decided_by[field] = f"default ({_show(a.default)})"

    if not inbound and not outbound:
        # Table I: no inbound and no outbound connectivity disables networking, whatever the machine says.
        network_type = "none"
        d.decided_by["network_type"] = "job attributes InboundConnectivity = false and OutboundConnectivity = false"
    protocols = job_proto & machine_proto
    if network_type != "none" and not protocols:
        raise LarkError(f"job wants {'+'.join(sorted(job_proto))} but the machine offers "
                        f"{'+'.join(sorted(machine_proto))}", job=job_id, obj="IPProtocol",
                        fix="add `Requirements = TARGET.IPProtocol == MY.IPProtocol` so such jobs do not match here")
    # A callout that sets VLAN has resolved the job's request (e.g. a name to an id): its answer stands.
    if requested_vlan is not None and vlan is not None and requested_vlan != vlan and "VLAN" not in overridden:
        raise LarkError(f"job requested VLAN {requested_vlan!r} but the machine decided {vlan!r}", job=job_id,
                        obj="RequestedVLAN", fix="use the mutual VLAN Requirements in policies/vlan.ad")
    if requested_vlan is not None and vlan is None and network_type != "none":
        raise LarkError(f"job requested VLAN {requested_vlan!r} but this machine has no VLAN", job=job_id,
                        obj="RequestedVLAN", fix="use the mutual VLAN Requirements in policies/vlan_machine.ad")
    if isinstance(vlan, str):
        raise LarkError(f"VLAN {vlan!r} is a name, not an id", job=job_id, obj="VLAN",
                        fix="configure a callout that maps VLAN names to ids (callouts/vlan_by_name.py)")

    rate_limit = _rate_limit(d, cfg, uplink_mbit) if network_type != "none" else None
    fair_capacity = d.fair_capacity if network_type != "none" else None

    return NetworkPlan(
        job_id=job_id, slot=slot, key=key, network_type=network_type, inbound=inbound, outbound=outbound,
        accounting=bool(want_acct and have_acct), ip_protocol="+".join(sorted(protocols)) or "none",
        address_type=address_type, request_bandwidth_mbit=request_bw, rate_limit_mbit=rate_limit, vlan=vlan,
        fair_share_capacity_mbit=fair_capacity,
        owner=_string_or_empty(job, "Owner"),
        accounting_group=_string_or_empty(job, "AcctGroup") or _string_or_empty(job, "AccountingGroup"),
        global_job_id=_string_or_empty(job, "GlobalJobId"),
        scitag=scitag(d, parse_rules(cfg.scitags)) if network_type != "none" else 0,
        job_attrs=forwarded_attrs(job, cfg.controller_attributes), decided_by=d.decided_by,
    )


def scitag(d: _Decider, rules: list[Rule]) -> int:
    """The job's SciTags tag (experiment << 6 | activity): the first LARK_SCITAGS rule whose expression is true of
    the job ad. Tags are reports, not permissions: an expression that cannot be evaluated tags nothing and is
    logged, it never holds the job."""
    for rule in rules:
        where = f"LARK_SCITAGS line {rule.line}: {rule.expression[:200]}"
        try:
            value = _py(classad2.ExprTree(rule.expression).eval(d.job))
        except (classad2.ClassAdException, RuntimeError, ValueError, TypeError) as e:
            log.error("job %s: %s cannot be evaluated (%s); fix the rule in LARK_SCITAGS", d.job_id, where, e)
            continue
        if value is classad2.Value.Error:
            log.warning("job %s: %s evaluates to ERROR on its ad; that rule tags nothing", d.job_id, where)
        if value is True:
            d.decided_by["scitag"] = f"{where} (experiment {rule.experiment}, activity {rule.activity})"
            return rule.scitag
    if rules:
        d.decided_by["scitag"] = "no LARK_SCITAGS rule is true of the job ad"
    return 0


def forwarded_attrs(job: classad2.ClassAd, names: list[str]) -> dict:
    """The job attributes the pool's SDN policies name, as plain values (the controller re-evaluates them)."""
    out = {}
    for name in names:
        v = _py(job.eval(name)) if name in job else None
        if isinstance(v, (str, int, float, bool)):
            out[name] = v
    return out
