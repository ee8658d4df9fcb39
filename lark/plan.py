"""The decided network plan for one job: plain data that every attach mode, firewall and shaper reads."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

NETWORK_TYPES = ("nat", "bridge", "ovs_bridge", "none")


@dataclass
class NetworkPlan:
    job_id: str                      # "cluster.proc" from the trusted job ad, for messages and reports
    slot: str
    key: str
    network_type: str = "nat"
    inbound: bool = False
    outbound: bool = True
    accounting: bool = True
    ip_protocol: str = "IPv4"
    address_type: str = "static"
    request_bandwidth_mbit: float = 0.0
    rate_limit_mbit: float | None = None  # each direction; None = unlimited. From the slot's allocation
    # No allocation, default_bandwidth = "fair": the link's capacity; larkd sets rate_limit_mbit to this job's
    # share of what reserved jobs leave, and changes it as jobs come and go (lark/kernel/fairshare.py).
    fair_share_capacity_mbit: float | None = None
    vlan: int | None = None
    owner: str = ""
    accounting_group: str = ""
    ipv4: str | None = None           # filled by address allocation
    ipv4_prefix: int = 32
    gateway4: str | None = None
    ipv6: str | None = None
    ipv6_prefix: int = 128
    gateway6: str | None = None
    inbound_port: int | None = None   # NAT mode with InboundConnectivity: host port forwarded to the job
    dhcp: dict | None = None          # AddressType dhcp: the lease (address, server, times), see dhcp.Lease
    decided_by: dict = field(default_factory=dict)  # field -> what decided it (attribute, expression, callout)

    @property
    def has_network(self) -> bool:
        return self.network_type != "none"

    @property
    def wants_ipv4(self) -> bool:
        return "IPv4" in self.ip_protocol.split("+")

    @property
    def wants_ipv6(self) -> bool:
        return "IPv6" in self.ip_protocol.split("+")

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "NetworkPlan":
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in known})
