"""The kernel layer's configuration: one small frozen section per consumer, holding exactly the knobs it reads.

lark/config.py's flat `Config` stays the source of the knobs (one `LARK_<FIELD>` each); the attach modes, the
firewall drivers and the DNS forwarder keep only their section, built here from a Config by field name
(`Section.from_config`; a section field may also name a derived Config property such as `ipam_dir`).
`make_modes` and `make_firewall` build them; constructors and functions that callers outside the kernel still
hand the whole Config take either and keep the section (`Section.of`).

No field here is live (`config.live`): condor_reconfig changes none of them in a running larkd, so a section
captured at start is what the kernel would have read from the Config anyway (tests/unit/test_sections.py
checks this).
"""
from __future__ import annotations

import dataclasses
import ipaddress
from dataclasses import dataclass
from typing import TypeVar

from ..config import Config

S = TypeVar("S", bound="Section")


@dataclass(frozen=True)
class Section:
    @classmethod
    def from_config(cls: type[S], cfg: Config) -> S:
        """This section of `cfg`: each field takes the Config attribute of its name."""
        return cls(**{f.name: getattr(cfg, f.name) for f in dataclasses.fields(cls)})

    @classmethod
    def of(cls: type[S], cfg: Config | S) -> S:
        """`cfg` itself when it is already this section, else this section of the Config."""
        if isinstance(cfg, Config):
            return cls.from_config(cfg)
        if not isinstance(cfg, cls):
            raise TypeError(f"{cls.__name__} or a Config expected, not {type(cfg).__name__}: build the section with "
                            f"{cls.__name__}.from_config(cfg)")
        return cfg


@dataclass(frozen=True)
class NatSection(Section):
    """NAT mode (lark/kernel/attach/nat.py): its address pools and the route out."""
    uplink: str
    ipam_dir: str
    subnet: str
    subnet6: str

    @property
    def gateway(self) -> ipaddress.IPv4Address:
        return ipaddress.IPv4Network(self.subnet).network_address + 1


@dataclass(frozen=True)
class BridgedSection(Section):
    """What both bridged modes read: the site network's addresses (lark/kernel/attach/base.py BridgedMode)."""
    ipam_dir: str
    bridge_range: str
    bridge_prefix: int
    bridge_gateway: str
    bridge_range6: str
    bridge_prefix6: int
    bridge_gateway6: str


@dataclass(frozen=True)
class BridgeSection(BridgedSection):
    """Linux-bridge mode (lark/kernel/attach/bridge.py)."""
    run_dir: str
    bridge_name: str
    bridge_uplink: str
    bridge_isolate_jobs: bool
    nft_table: str


@dataclass(frozen=True)
class OvsSection(BridgedSection):
    """Open vSwitch mode (lark/kernel/attach/ovs.py)."""
    ovs_db: str
    ovs_bridge_name: str
    ovs_rundir: str
    ovs_uplink: str
    ovs_datapath: str
    bridge_ipv6: str
    dns_forward: bool
    dns_address: str


@dataclass(frozen=True)
class FirewallSection(Section):
    """Both firewall drivers (lark/kernel/firewall/nftables.py, iptables.py) and forwarding.lark_only."""
    nft_table: str
    uplink: str
    subnet: str
    subnet6: str
    bridge_range: str
    bridge_name: str
    ovs_bridge_name: str
    bridge_ipv6: str
    allow_job_to_host: bool
    allow_job_to_job: bool
    dns_forward: bool
    dns_address: str
    dns_query_rate: int
    forward_policy: str
    run_dir: str

    @property
    def network(self) -> ipaddress.IPv4Network:
        return ipaddress.IPv4Network(self.subnet)


@dataclass(frozen=True)
class DnsSection(Section):
    """The host's DNS forwarder and the per-job IPv6 relays (lark/kernel/dns.py, dns6.py)."""
    run_dir: str
    netns_prefix: str
    resolv_conf: str
    dns_forward: bool
    dns_address: str
    dns_user: str
