"""larkd configuration: a TOML file with [daemon] and [network] tables, validated on load."""
from __future__ import annotations

import dataclasses
import ipaddress
import os
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from .errors import LarkError

DEFAULT_PATH = "/etc/lark/lark.toml"
IFNAME_RE = re.compile(r"^[A-Za-z0-9_.-]{1,15}$")


@dataclass
class Config:
    # [daemon]
    socket: str = "/run/lark/lark.sock"
    run_dir: str = "/run/lark"          # records and address locks: same lifetime as the kernel objects
    state_dir: str = "/var/lib/lark"    # finished-job accounting survives reboots
    netns_dir: str = "/run/netns"
    netns_prefix: str = "lark-"
    starter_paths: list[str] = field(default_factory=lambda: ["/usr/sbin/condor_starter"])
    ad_source: str = "startd"           # "startd": the local startd and schedd (htcondor2); "files": ad_dir
    ad_dir: str = "/run/lark/ads"
    poll_interval: float = 5.0
    request_timeout: float = 5.0
    max_request_bytes: int = 65536
    setup_workers: int = 4
    finished_keep: int = 10000
    callout: str = ""
    callout_timeout: float = 5.0
    # [network]
    uplink: str = "eth0"
    subnet: str = "10.213.0.0/16"
    subnet6: str = ""                   # IPv6 for NAT mode (NAT66), e.g. "fd00:213::/64"; "" = no IPv6
    firewall: str = "nftables"          # or "iptables"
    nft_table: str = "lark"
    allow_job_to_job: bool = False
    allow_job_to_host: bool = False
    inbound_ports: str = "20000-20999"
    enable_ip_forward: bool = True
    default_network_type: str = "nat"
    bandwidth_mbit: int = 0             # used by detect-bandwidth when the uplink reports no speed
    # Limit for jobs whose slot was allocated no Bandwidth: "unlimited", "share" (the machine's bandwidth
    # times the slot's share of its cpus), or a number of Mbit/s.
    default_bandwidth: str = "unlimited"
    # Bridge mode: jobs get addresses on the site network through a Linux bridge.
    bridge_name: str = "lkbr0"          # created if missing (STP off, forward delay 0), adopted if present
    bridge_uplink: str = ""             # enslaved when Lark creates the bridge; its addresses move to the bridge
    bridge_range: str = ""              # job addresses, "first-last" on the bridged network
    bridge_prefix: int = 24             # prefix length of the bridged network
    bridge_gateway: str = ""            # default route of bridged jobs
    bridge_range6: str = ""             # bridged IPv6 job addresses, "first-last"; "" = no IPv6 when bridged
    bridge_prefix6: int = 64
    bridge_gateway6: str = ""
    # Mixed into bridged jobs' MACs so that EPs on one network never hand out the same MAC for equal slot
    # names; "" = this machine's /etc/machine-id. Set it per EP where EPs share a machine id (cloned images).
    job_mac_seed: str = ""
    dhcp_release: bool = False          # release a job's lease when it ends (else cache it for the slot's next job)
    dhcp_renew_interval: float = 0.0    # renew at least this often (s); 0: at the server's T1 only
    # Open vSwitch mode ("ovs_bridge"): same addressing keys as bridge mode.
    ovs_bridge_name: str = "lkovs0"
    ovs_uplink: str = ""
    ovs_db: str = "unix:/var/run/openvswitch/db.sock"
    ovs_rundir: str = "/var/run/openvswitch"   # where ovs-vswitchd puts <bridge>.mgmt
    ovs_datapath: str = "auto"          # "system" (kernel module), "netdev" (userspace), or auto-detect
    # The pool's SDN controller (lark-controller, docs/controller.md): bridged jobs are registered there.
    controller_url: str = ""            # e.g. "https://10.77.0.2:8443"; "" = no controller
    controller_ca: str = "/etc/lark/controller/ca.pem"    # the CA that signed the controller's certificate
    controller_cert: str = "/etc/lark/controller/ep.pem"  # this EP's client certificate (its name = the EP)
    controller_key: str = "/etc/lark/controller/ep.key"
    # The controller's certificate must name this (or the controller_url's host): an EP's certificate from the
    # same CA can then not pose as the controller.
    controller_name: str = "controller"
    controller_timeout: float = 2.0     # seconds to wait for the controller's acknowledgement of a job's flows
    controller_failure: str = "closed"  # controller unreachable: "closed" refuses the job, "open" starts it
    controller_resync: float = 30.0     # seconds between full resyncs of this EP's job list (and after restarts)
    controller_attributes: list[str] = field(default_factory=list)  # job ad attributes the SDN policies name

    @property
    def records_dir(self) -> str:
        return os.path.join(self.run_dir, "jobs")

    @property
    def ipam_dir(self) -> str:
        return os.path.join(self.run_dir, "ipam")

    @property
    def lock_path(self) -> str:
        return os.path.join(self.run_dir, "larkd.lock")

    @property
    def network(self) -> ipaddress.IPv4Network:
        return ipaddress.IPv4Network(self.subnet)

    @property
    def gateway(self) -> ipaddress.IPv4Address:
        return self.network.network_address + 1

    @property
    def port_range(self) -> tuple[int, int]:
        lo, _, hi = self.inbound_ports.partition("-")
        return int(lo), int(hi or lo)

    def validate(self) -> "Config":
        def bad(key: str, why: str, fix: str) -> LarkError:
            return LarkError(why, obj=f"config key {key!r}", fix=fix)

        if not IFNAME_RE.fullmatch(self.uplink):
            raise bad("uplink", f"{self.uplink!r} is not a valid interface name", "use the name `ip link` shows")
        try:
            net = ipaddress.IPv4Network(self.subnet)
        except ValueError as e:
            raise bad("subnet", str(e), "give an IPv4 network such as 10.213.0.0/16") from None
        if net.num_addresses < 4:
            raise bad("subnet", f"{self.subnet} is too small", "use a /30 or larger")
        if self.firewall not in ("nftables", "iptables"):
            raise bad("firewall", f"unknown backend {self.firewall!r}", "use nftables or iptables")
        if self.ad_source not in ("startd", "files"):
            raise bad("ad_source", f"unknown ad source {self.ad_source!r}", "use startd or files")
        if not re.fullmatch(r"[A-Za-z][A-Za-z0-9_]{0,31}", self.nft_table):
            raise bad("nft_table", f"{self.nft_table!r} is not a safe table name", "letters, digits, _")
        if not re.fullmatch(r"[A-Za-z0-9_.-]{1,40}", self.netns_prefix):
            raise bad("netns_prefix", f"{self.netns_prefix!r} is not a safe name prefix", "letters, digits, _.-")
        try:
            lo, hi = self.port_range
        except ValueError:
            raise bad("inbound_ports", f"{self.inbound_ports!r} is not a range", "write it as 20000-20999") from None
        if not (1 <= lo <= hi <= 65535):
            raise bad("inbound_ports", f"{self.inbound_ports!r} is out of 1-65535", "write it as 20000-20999")
        if self.poll_interval <= 0 or self.request_timeout <= 0:
            raise bad("poll_interval", "intervals must be positive", "use seconds, e.g. 5")
        if self.default_network_type not in ("nat", "bridge", "ovs_bridge", "none"):
            raise bad("default_network_type", f"{self.default_network_type!r} is not available",
                      "use nat, bridge, ovs_bridge or none")
        for key in ("bridge_name", "bridge_uplink", "ovs_bridge_name", "ovs_uplink"):
            v = getattr(self, key)
            if (v or key.endswith("_name")) and not IFNAME_RE.fullmatch(v):
                raise bad(key, f"{v!r} is not a valid interface name", "use a name `ip link` would accept")
        if not re.fullmatch(r"[A-Za-z0-9_.:@-]{0,64}", self.job_mac_seed):
            raise bad("job_mac_seed", f"{self.job_mac_seed!r} is not a plain name", "letters, digits and _.:@-")
        if self.ovs_datapath not in ("auto", "system", "netdev"):
            raise bad("ovs_datapath", f"unknown datapath {self.ovs_datapath!r}", "use auto, system or netdev")
        if not re.fullmatch(r"(unix:|tcp:|ssl:)[\w./:\[\]-]+", self.ovs_db):
            raise bad("ovs_db", f"{self.ovs_db!r} is not an OVSDB remote", "e.g. unix:/var/run/openvswitch/db.sock")
        if self.bridge_range:
            try:
                lo, hi = (ipaddress.IPv4Address(x.strip()) for x in self.bridge_range.split("-"))
                gw = ipaddress.IPv4Address(self.bridge_gateway)
                net = ipaddress.IPv4Network(f"{gw}/{self.bridge_prefix}", strict=False)
            except ValueError as e:
                raise bad("bridge_range", f"{self.bridge_range!r} with gateway {self.bridge_gateway!r}: {e}",
                          'write bridge_range = "192.0.2.100-192.0.2.199" and bridge_gateway = "192.0.2.1"') \
                    from None
            if not (lo <= hi and lo in net and hi in net) or lo <= gw <= hi:
                raise bad("bridge_range", f"{self.bridge_range} must lie in {net} and not contain the gateway",
                          "pick a range of the bridged network that its DHCP server does not hand out")
        if self.subnet6:
            try:
                net6 = ipaddress.IPv6Network(self.subnet6)
            except ValueError as e:
                raise bad("subnet6", str(e), 'give an IPv6 network such as "fd00:213::/64"') from None
            if net6.prefixlen > 120:
                raise bad("subnet6", f"{self.subnet6} is too small", "use a /64 (or up to /120)")
        if self.bridge_range6:
            try:
                lo6, hi6 = (ipaddress.IPv6Address(x.strip()) for x in self.bridge_range6.split("-"))
                gw6 = ipaddress.IPv6Address(self.bridge_gateway6)
            except ValueError as e:
                raise bad("bridge_range6", f"{self.bridge_range6!r} with gateway {self.bridge_gateway6!r}: {e}",
                          'write bridge_range6 = "2001:db8::100-2001:db8::1ff" and bridge_gateway6') from None
            if lo6 <= gw6 <= hi6:
                raise bad("bridge_range6", f"{self.bridge_range6} contains the gateway {gw6}", "exclude the gateway")
            if not lo6 <= hi6 or int(hi6) - int(lo6) > 1 << 20:
                raise bad("bridge_range6", f"{self.bridge_range6} is empty or larger than 2^20 addresses",
                          "give first-last of at most a million addresses")
        if self.controller_url and not re.fullmatch(r"https://[\w.\[\]:-]+(:\d+)?/?", self.controller_url):
            raise bad("controller_url", f"{self.controller_url!r} is not an https URL",
                      'write e.g. "https://10.77.0.2:8443" (mutual TLS), or "" for no controller')
        if not re.fullmatch(r"[A-Za-z0-9._-]{1,253}", self.controller_name):
            raise bad("controller_name", f"{self.controller_name!r} is not a certificate name",
                      "use the NAME given to `lark-controller certs` for the controller, e.g. controller")
        if self.controller_failure not in ("closed", "open"):
            raise bad("controller_failure", f"unknown mode {self.controller_failure!r}", "use closed or open")
        if self.controller_timeout <= 0 or self.controller_resync <= 0:
            raise bad("controller_timeout", "controller timeouts and intervals must be positive", "use seconds")
        if any(not re.fullmatch(r"[A-Za-z_]\w{0,99}", a) for a in self.controller_attributes):
            raise bad("controller_attributes", f"{self.controller_attributes} is not a list of attribute names",
                      'write e.g. ["AcctGroup", "ProjectName"]')
        self.default_bandwidth = str(self.default_bandwidth)
        if self.default_bandwidth not in ("unlimited", "share"):
            try:
                mbit = float(self.default_bandwidth)
            except ValueError:
                mbit = -1.0
            if not 0 < mbit <= 10_000_000:
                raise bad("default_bandwidth", f"{self.default_bandwidth!r} is not a limit",
                          'use "unlimited", "share" or a number of Mbit/s such as "100"')
        return self


_FIELDS = {f.name: f for f in dataclasses.fields(Config)}


def from_mapping(data: dict) -> Config:
    flat: dict = {}
    for section, values in data.items():
        if not isinstance(values, dict):
            raise LarkError(f"top-level key {section!r} must be a table", obj="config",
                            fix="put keys under [daemon] or [network]")
        for key, value in values.items():
            if key not in _FIELDS:
                raise LarkError(f"unknown key {section}.{key}", obj="config", fix="see docs/admin.md for the keys")
            flat[key] = value
    return Config(**flat).validate()


def load(path: str | None = None) -> Config:
    path = path or os.environ.get("LARK_CONFIG") or DEFAULT_PATH
    p = Path(path)
    if not p.exists():
        if path == DEFAULT_PATH:
            return Config().validate()
        raise LarkError("file does not exist", obj=f"config {path}", fix="create it or drop --config")
    try:
        data = tomllib.loads(p.read_text())
    except tomllib.TOMLDecodeError as e:
        raise LarkError(f"not valid TOML: {e}", obj=f"config {path}", fix="fix the syntax") from None
    return from_mapping(data)


def dump(cfg: Config) -> str:
    """Render a config as TOML (used by tests and the testbed to write config files)."""
    daemon_keys = {"socket", "run_dir", "state_dir", "netns_dir", "netns_prefix", "starter_paths", "ad_source",
                   "ad_dir", "poll_interval", "request_timeout", "max_request_bytes", "setup_workers",
                   "finished_keep", "callout", "callout_timeout"}
    out = {"daemon": [], "network": []}
    for f in dataclasses.fields(cfg):
        v = getattr(cfg, f.name)
        out["daemon" if f.name in daemon_keys else "network"].append(f"{f.name} = {_toml_value(v)}")
    return "".join(f"[{sec}]\n" + "\n".join(lines) + "\n\n" for sec, lines in out.items())


def _toml_value(v) -> str:
    import json
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    return json.dumps(str(v))
