"""The kernel layer's configuration: one small frozen section per consumer, holding exactly the knobs it reads.

lark/config.py's flat `Config` stays the source of the knobs (one `LARK_<FIELD>` each); every kernel class and
function (the attach modes, the firewall drivers, the DNS forwarder and relays, dhcp6, mtu.for_job,
forwarding.claim) takes only its section, built here from a Config by field name (`Section.from_config`; a
section field may also name a derived Config property such as `ipam_dir`). Whoever holds the Config builds the
sections once: `make_modes` / `make_firewall` (the wiring), JobNetworker (`JobSections`), larkd, the CLI.
A constructor handed the wrong thing (a Config, another section) refuses it (`Section.expect`).

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
    def expect(cls: type[S], cfg: S) -> S:
        """`cfg`, checked to be this section (an untyped caller may still hand a Config or another section)."""
        if not isinstance(cfg, cls):
            raise TypeError(f"{cls.__name__} expected, not {type(cfg).__name__}: build the section with "
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


@dataclass(frozen=True)
class Dhcp6Section(Section):
    """The per-job DHCPv6 clients (lark/kernel/dhcp6.py): where their directories live."""
    run_dir: str


@dataclass(frozen=True)
class MtuSection(Section):
    """The job veth's MTU (lark/kernel/mtu.py for_job): the override; 0 follows the attach mode."""
    job_mtu: int


@dataclass(frozen=True)
class ForwardingSection(Section):
    """Whether larkd turns IPv4 forwarding on and remembers it did (lark/kernel/forwarding.py claim)."""
    run_dir: str
    enable_ip_forward: bool
    forward_policy: str


@dataclass(frozen=True)
class JobSections:
    """The sections a JobNetworker hands the kernel per job (built once from its Config; the Config itself stays
    for the live knobs)."""
    dns: DnsSection
    dhcp6: Dhcp6Section
    mtu: MtuSection

    @classmethod
    def from_config(cls, cfg: Config) -> JobSections:
        return cls(dns=DnsSection.from_config(cfg), dhcp6=Dhcp6Section.from_config(cfg),
                   mtu=MtuSection.from_config(cfg))
