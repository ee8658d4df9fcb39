"""The controller's one TOML file: where it listens, its TLS files, the WAN ports, the site prefixes, the policies."""
from __future__ import annotations

import ipaddress
import os
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

import classad2

from ..errors import LarkError
from .wan import WanPlan, parse_groups

POLICY_KINDS = ("drop", "slice", "wan_drop", "wan_steer")


@dataclass
class Policy:
    name: str
    kind: str          # drop | slice | wan_drop | wan_steer
    select: str        # ClassAd expression over the job ad; true selects the job
    port: str = ""     # wan_steer: the OVS port name the selected jobs' WAN traffic leaves by
    slice_by: str = "Owner"  # slice: the job attribute whose value names the slice

    def expr(self) -> classad2.ExprTree:
        return classad2.ExprTree(self.select)


@dataclass
class EpScope:
    """What one EP (its certificate name) may register, from its [ep.NAME] section: jobs whose addresses are in
    `networks`, whose frames enter the switch by one of `ports`, at most `max_jobs` of them."""
    name: str
    ports: list[str]
    networks: list[ipaddress.IPv4Network | ipaddress.IPv6Network]
    max_jobs: int

    def holds(self, address: str) -> bool:
        a = ipaddress.ip_address(address)
        return any(a in n for n in self.networks)


def parse_networks(values: object, where: str) -> list[ipaddress.IPv4Network | ipaddress.IPv6Network]:
    """Networks ("10.77.0.0/24") and ranges ("10.77.0.100-10.77.0.149", as larkd's bridge_range) as networks."""
    fix = 'list networks or ranges, e.g. addresses = ["10.77.0.100-10.77.0.149", "fd00:77::/64"]'
    if not isinstance(values, list) or not values:
        raise LarkError(f"addresses = {values!r} is not a non-empty list", obj=f"controller config [{where}]", fix=fix)
    out: list[ipaddress.IPv4Network | ipaddress.IPv6Network] = []
    for v in values:
        try:
            if isinstance(v, str) and "-" in v:
                first, last = (ipaddress.ip_address(x.strip()) for x in v.split("-", 1))
                out += ipaddress.summarize_address_range(first, last)
            else:
                out.append(ipaddress.ip_network(str(v)))
        except (ValueError, TypeError) as e:
            raise LarkError(f"{v!r} is not a network or range: {e}", obj=f"controller config [{where}]",
                            fix=fix) from None
    return out


@dataclass
class ControllerConfig:
    # [openflow]: switches connect here (OpenFlow 1.3)
    openflow_host: str = "0.0.0.0"
    openflow_port: int = 6653
    # OpenFlow is over TLS with the [api] CA/cert/key: a switch presents a certificate signed by `ca` with the switch
    # role, bound to its datapath id (lark.controller.certs). Plain TCP lets anyone who reaches the port act as the
    # switch, so it takes this explicit knob (a warning at start).
    insecure_plain_openflow: bool = False
    # [openflow] tls, from configs older than issue 26: only `true` (the default) or false with the knob above
    openflow_tls: bool | None = None
    # [api]: larkd registers jobs here over mutual TLS
    api_host: str = "0.0.0.0"
    api_port: int = 8443
    ca: str = "/etc/lark/controller/ca.pem"
    cert: str = "/etc/lark/controller/controller.pem"
    key: str = "/etc/lark/controller/controller.key"
    # Certificate common names allowed to act for any EP (e.g. an operator's tool); EPs act only for themselves
    admin_names: list[str] = field(default_factory=list)
    # The API's own bounds (issue 26): TLS handshakes run in one thread without blocking, each with this deadline,
    # at most `max_handshakes` at once (the oldest is dropped); authenticated requests run in `workers` threads.
    handshake_timeout: float = 5.0
    max_handshakes: int = 256
    workers: int = 16
    # [ep.NAME] sections: what each EP may register (EpScope). None at all: any EP may register any address (a
    # warning at start); once there is one, an EP without its own section is refused.
    eps: dict[str, EpScope] = field(default_factory=dict)
    max_jobs_per_ep: int = 4096          # [api] default of each [ep.NAME] max_jobs, and the quota of unlisted EPs
    # [switch]
    wan_ports: list[str] = field(default_factory=list)   # OVS port names; the first is the normal WAN exit
    site_prefixes: list[str] = field(default_factory=list)  # destinations that are not "the WAN"
    barrier_timeout: float = 2.0         # seconds to wait for each switch to acknowledge a job's flows
    # Jobs unknown to the controller are removed from switches only after this long since start, so that
    # every larkd has had its periodic full resync (larkd resyncs every controller_resync seconds).
    reconcile_grace: float = 30.0
    reconcile_interval: float = 60.0
    # Jobs on the same EP (lark.controller.hairpin): EP certificate name -> switch port its uplink is on. Those EPs
    # isolate their job ports (larkd bridge_isolate_jobs), and the controller sends their jobs' frames back.
    ep_ports: dict[str, str] = field(default_factory=dict)
    policies: list[Policy] = field(default_factory=list)
    # [[wan_group]] sections (issue 12, lark.controller.wan): per-group WAN limits; [wan] unmatched = pass | drop
    wan_groups: list = field(default_factory=list)
    wan_unmatched: str = "pass"
    # [wan] mechanism: "meter" (OpenFlow 1.3 meters, policing) or "queue" (queues on the WAN ports, shaping)
    wan_mechanism: str = "meter"
    # [wan] ovsdb: with "queue", the OVSDB of the Open vSwitch whose WAN ports get Lark's queues; "" = the site made
    # the queues itself (hardware switch, vendor tooling) and Lark only sends set_queue
    wan_ovsdb: str = "unix:/var/run/openvswitch/db.sock"
    # [wan] tc_netns: with "queue" on a userspace datapath, the named network namespace (`ip netns`) the WAN ports
    # are in, when the controller runs on the switch host but not in that namespace; "" = the controller's own
    wan_tc_netns: str = ""
    # [metrics] address: Prometheus metrics over HTTP at "host:port" (lark.controller.metrics); "" = off
    metrics_address: str = ""
    # [labels] mode (issue 26, lark.controller.labels): "off" = per-job flows on the core (about 5 a job); "vlan" = the
    # EPs tag each job's frames with the label the registration answer gives, and the core's flows grow with EPs and
    # policies only. Needs [ep.NAME] sections (the core binds each EP's port to its addresses) and EPs that tag.
    labels_mode: str = "off"

    @property
    def attributes(self) -> list[str]:
        """Job attributes the policies name (larkd must forward these: its `controller_attributes`)."""
        names: set[str] = set()
        for p in self.policies:
            names.update(r.split(".")[-1] for r in classad2.ClassAd().externalRefs(p.expr()) if r)
            if p.kind == "slice":
                names.add(p.slice_by)
        return sorted(names)

    def validate(self) -> ControllerConfig:
        def bad(key: str, why: str, fix: str) -> LarkError:
            return LarkError(why, obj=f"controller config key {key!r}", fix=fix)

        if not isinstance(self.insecure_plain_openflow, bool) or self.openflow_tls not in (None, True, False):
            raise bad("openflow.insecure_plain_openflow", "tls and insecure_plain_openflow take true or false",
                      "remove them: OpenFlow is over TLS by default")
        if self.openflow_tls is False and not self.insecure_plain_openflow:
            raise bad("openflow.tls", "tls = false would let anyone who reaches the OpenFlow port act as the switch",
                      "remove it and give the switch a certificate (lark-controller certs switch:DPID), or write "
                      "insecure_plain_openflow = true under [openflow] to accept that")
        if self.openflow_tls is True and self.insecure_plain_openflow:
            raise bad("openflow.tls", "tls = true contradicts insecure_plain_openflow = true", "keep one of them")
        for key in ("openflow_port", "api_port"):
            v = getattr(self, key)
            if not isinstance(v, int) or not 0 <= v <= 65535:
                raise bad(key, f"{v!r} is not a port", "use 1-65535 (0 only in tests: any free port)")
        for key in ("openflow_host", "api_host"):
            try:
                ipaddress.ip_address(getattr(self, key))
            except ValueError:
                raise bad(key, f"{getattr(self, key)!r} is not an IP address", 'e.g. "0.0.0.0"') from None
        for prefix in self.site_prefixes:
            try:
                ipaddress.ip_network(prefix)
            except ValueError as e:
                raise bad("site_prefixes", str(e), 'list networks such as "10.77.0.0/16"') from None
        if len(set(self.wan_ports)) != len(self.wan_ports):
            raise bad("wan_ports", f"{self.wan_ports} names a port twice", "list each OVS port name once")
        if self.barrier_timeout <= 0 or self.reconcile_grace < 0 or self.reconcile_interval <= 0:
            raise bad("barrier_timeout", "timeouts and intervals must be positive", "use seconds, e.g. 2")
        if not isinstance(self.ep_ports, dict) or any(
                not isinstance(k, str) or not isinstance(v, str) or not k or not v for k, v in self.ep_ports.items()):
            raise bad("ep_ports", f"{self.ep_ports!r} is not a table of EP names to port names",
                      'write ep_ports = { ep1 = "ep1", ep2 = "ep2" } under [switch]')
        ports = list(self.ep_ports.values())
        if len(set(ports)) != len(ports) or set(ports) & set(self.wan_ports):
            raise bad("ep_ports", f"{self.ep_ports} names a port twice or a WAN port",
                      "give each EP the one switch port its uplink is on, never a port of wan_ports")
        self._validate_eps(bad)
        WanPlan(self.wan_groups, self.wan_unmatched, self.wan_mechanism, self.wan_ports)   # errors name the key
        if not isinstance(self.wan_ovsdb, str) or (self.wan_ovsdb and not self.wan_ovsdb.startswith(
                ("unix:", "tcp:", "ssl:"))):
            raise bad("wan.ovsdb", f"{self.wan_ovsdb!r} is not an OVSDB remote",
                      'e.g. "unix:/var/run/openvswitch/db.sock", or "" when the site makes the queues itself')
        if not isinstance(self.wan_tc_netns, str) or "/" in self.wan_tc_netns:
            raise bad("wan.tc_netns", f"{self.wan_tc_netns!r} is not a network namespace name",
                      'the name `ip netns list` shows for the namespace of the WAN ports, or "" for the own one')
        if self.metrics_address:
            host, sep, port = self.metrics_address.rpartition(":")
            if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
                raise bad("metrics.address", f"{self.metrics_address!r} is not host:port",
                          'use e.g. "127.0.0.1:9814", or remove [metrics] to turn metrics off')
        if (self.wan_groups or self.wan_unmatched == "drop") and not self.site_prefixes:
            raise bad("site_prefixes", "[[wan_group]] needs to know which destinations are not the WAN",
                      'set site_prefixes = ["10.77.0.0/16"] under [switch]')
        if self.labels_mode not in ("off", "vlan"):
            raise bad("labels.mode", f"{self.labels_mode!r} is not a label scheme",
                      'use "off" (per-job flows) or "vlan"')
        if self.labels_mode == "vlan" and not self.eps:
            raise bad("labels.mode", 'mode = "vlan" binds each EP\'s switch port to its job addresses, and there is '
                      "no [ep.NAME] section", 'add [ep.NAME] with ports and addresses for every EP, or mode = "off"')
        if self.labels_mode == "vlan" and len(self.wan_ports) > 6:
            raise bad("labels.mode", f"{len(self.wan_ports)} WAN ports: the label's 3 priority bits carry none, "
                      "drop and at most 6 ports", 'list at most 6 wan_ports, or mode = "off"')
        names = set()
        for p in self.policies:
            where = f"policy {p.name!r}"
            if p.name in names:
                raise bad("policy", f"{where} is defined twice", "give every [[policy]] its own name")
            names.add(p.name)
            if p.kind not in POLICY_KINDS:
                raise bad("policy", f"{where} has unknown kind {p.kind!r}", f"use one of {', '.join(POLICY_KINDS)}")
            try:
                p.expr()
            except Exception as e:
                raise bad("policy", f"{where}: select = {p.select!r} is not a ClassAd expression ({e})",
                          'write e.g. select = \'Owner == "mallory"\'') from None
            if p.kind == "wan_steer" and p.port not in self.wan_ports[1:]:
                raise bad("policy", f"{where} steers to port {p.port!r}, which is not an alternate WAN port",
                          f"name one of wan_ports after the first: {self.wan_ports[1:]}")
            if p.kind in ("wan_drop", "wan_steer") and not self.site_prefixes:
                raise bad("site_prefixes", f"{where} needs to know which destinations are not the WAN",
                          'set site_prefixes = ["10.77.0.0/16"] under [switch]')
        return self

    def _validate_eps(self, bad) -> None:
        for key in ("handshake_timeout", "max_handshakes", "workers", "max_jobs_per_ep"):
            v = getattr(self, key)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or v <= 0 or (key != "handshake_timeout"
                                                                                     and not isinstance(v, int)):
                raise bad(f"api.{key}", f"{v!r} is not a positive number", "e.g. handshake_timeout = 5.0, "
                          "max_handshakes = 256, workers = 16, max_jobs_per_ep = 4096")
        owner_of_port: dict[str, str] = {}
        seen: list[tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, str]] = []
        for name, ep in self.eps.items():
            for port in ep.ports:
                if port in owner_of_port or port in self.wan_ports:
                    raise bad(f"ep.{name}.ports", f"port {port!r} is also {owner_of_port.get(port, 'a WAN port')}'s",
                              "give each EP the switch ports only its uplink uses")
                owner_of_port[port] = name
            if name in self.ep_ports and self.ep_ports[name] not in ep.ports:
                raise bad(f"ep.{name}.ports", f"[switch] ep_ports says {name}'s uplink is on port "
                          f"{self.ep_ports[name]!r}, which its ports {ep.ports} lack", "list that port in both")
            for net in ep.networks:
                other = next((o for n, o in seen if n.version == net.version and n.overlaps(net)), None)
                if other is not None:
                    raise bad(f"ep.{name}.addresses", f"{net} overlaps the addresses of EP {other!r}",
                              "give each EP its own addresses (larkd's bridge_range on that EP)")
                seen.append((net, name))

    def scope(self, ep: str) -> EpScope | None:
        """The EP's [ep.NAME] section; None for an unlisted EP (refused when any section exists)."""
        return self.eps.get(ep)


def parse_eps(data: object, default_max_jobs: int) -> dict[str, EpScope]:
    if not isinstance(data, dict):
        raise LarkError("[ep] must hold one table per EP", obj="controller config",
                        fix='write [ep.ep1] with ports = ["ep1"] and addresses = ["10.77.0.100-10.77.0.149"]')
    out = {}
    for name, sec in data.items():
        where = f"ep.{name}"
        unknown = set(sec) - {"ports", "addresses", "max_jobs"} if isinstance(sec, dict) else {"?"}
        if unknown or "ports" not in sec or "addresses" not in sec:
            raise LarkError(f"[{where}] has unknown keys {sorted(unknown)} or lacks ports/addresses",
                            obj="controller config", fix=f"[{where}] takes ports, addresses and max_jobs")
        ports, max_jobs = sec["ports"], sec.get("max_jobs", default_max_jobs)
        if not isinstance(ports, list) or not ports or not all(isinstance(p, str) and p for p in ports):
            raise LarkError(f"ports = {ports!r} is not a non-empty list of switch port names",
                            obj=f"controller config [{where}]", fix='e.g. ports = ["ep1"] (OVS port names)')
        if isinstance(max_jobs, bool) or not isinstance(max_jobs, int) or max_jobs <= 0:
            raise LarkError(f"max_jobs = {max_jobs!r} is not a positive number", obj=f"controller config [{where}]",
                            fix="e.g. max_jobs = 4096, or leave it out for [api] max_jobs_per_ep")
        out[name] = EpScope(name, list(ports), parse_networks(sec["addresses"], where), max_jobs)
    return out


_SECTIONS = {
    "openflow": {"host": "openflow_host", "port": "openflow_port", "tls": "openflow_tls",
                 "insecure_plain_openflow": "insecure_plain_openflow"},
    "api": {"host": "api_host", "port": "api_port", "ca": "ca", "cert": "cert", "key": "key",
            "admin_names": "admin_names", "handshake_timeout": "handshake_timeout",
            "max_handshakes": "max_handshakes", "workers": "workers", "max_jobs_per_ep": "max_jobs_per_ep"},
    "switch": {"wan_ports": "wan_ports", "site_prefixes": "site_prefixes", "barrier_timeout": "barrier_timeout",
               "reconcile_grace": "reconcile_grace", "reconcile_interval": "reconcile_interval",
               "ep_ports": "ep_ports"},
    "wan": {"unmatched": "wan_unmatched", "mechanism": "wan_mechanism", "ovsdb": "wan_ovsdb",
            "tc_netns": "wan_tc_netns"},
    "metrics": {"address": "metrics_address"},
    "labels": {"mode": "labels_mode"},
}


def from_mapping(data: dict, base_dir: str = ".") -> ControllerConfig:
    kw: dict = {}
    for section, keys in data.items():
        if section in ("policy", "wan_group", "ep"):
            continue
        if section not in _SECTIONS or not isinstance(keys, dict):
            raise LarkError(f"unknown section [{section}]", obj="controller config",
                            fix="use [openflow], [api], [switch], [wan], [metrics], [labels], [ep.NAME], [[policy]] "
                                "and [[wan_group]] "
                                "(docs/controller.md)")
        for key, value in keys.items():
            if key not in _SECTIONS[section]:
                raise LarkError(f"unknown key {section}.{key}", obj="controller config",
                                fix=f"keys of [{section}]: {', '.join(_SECTIONS[section])}")
            kw[_SECTIONS[section][key]] = value
    for key in ("ca", "cert", "key"):
        if key in kw:  # relative TLS paths are relative to the config file, so a config dir can move as a whole
            kw[key] = os.path.join(base_dir, kw[key])
    policies = []
    for i, p in enumerate(data.get("policy", [])):
        unknown = set(p) - {"name", "kind", "select", "port", "slice_by"}
        if unknown or "kind" not in p or "select" not in p:
            raise LarkError(f"[[policy]] number {i + 1} has unknown keys {sorted(unknown)} or lacks kind/select",
                            obj="controller config", fix="each [[policy]] has name, kind, select (and port)")
        policies.append(Policy(name=p.get("name", f"policy{i + 1}"), kind=p["kind"], select=p["select"],
                               port=p.get("port", ""), slice_by=p.get("slice_by", "Owner")))
    wan_groups = parse_groups(data.get("wan_group", []))
    eps = parse_eps(data.get("ep", {}), kw.get("max_jobs_per_ep", ControllerConfig.max_jobs_per_ep))
    return ControllerConfig(**kw, policies=policies, wan_groups=wan_groups, eps=eps).validate()


def load(path: str) -> ControllerConfig:
    p = Path(path)
    try:
        data = tomllib.loads(p.read_text())
    except FileNotFoundError:
        raise LarkError("file does not exist", obj=f"controller config {path}",
                        fix="start from policies/sdn.toml") from None
    except tomllib.TOMLDecodeError as e:
        raise LarkError(f"not valid TOML: {e}", obj=f"controller config {path}", fix="fix the syntax") from None
    return from_mapping(data, str(p.parent.resolve()))
