"""The decided network plan for one job, and what setup built from it.

`NetworkPlan` is what policy decided: immutable once `decide` returns. `Addresses` is what setup obtained for it
(static or DHCP addresses, gateways, the inbound port). `JobNetwork` pairs the two; it is what the attach modes
and firewall drivers read, and `JobNetwork.to_dict` is the one serialised form (records and the wire answer).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

NETWORK_TYPES = ("nat", "bridge", "ovs_bridge", "none")


def _known(cls, d: dict) -> dict:
    names = {f.name for f in dataclasses.fields(cls)}
    return {k: v for k, v in d.items() if k in names}


@dataclass(frozen=True)
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
    global_job_id: str = ""           # the job's GlobalJobId: `lark report` matches EP records with history by it
    scitag: int = 0                   # SciTags experiment << 6 | activity from LARK_SCITAGS (lark/scitags.py); 0 = none
    job_attrs: dict = field(default_factory=dict)   # job ad values forwarded to the SDN controller
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
    def from_dict(cls, d: dict) -> NetworkPlan:
        return cls(**_known(cls, d))


@dataclass(frozen=True)
class Addresses:
    """What setup obtained for a plan: filled step by step with dataclasses.replace, never mutated."""
    ipv4: str | None = None
    ipv4_prefix: int = 32
    gateway4: str | None = None
    ipv6: str | None = None
    ipv6_prefix: int = 128
    gateway6: str | None = None
    inbound_port: int | None = None   # NAT mode with InboundConnectivity: host port forwarded to the job
    dhcp: dict | None = None          # AddressType dhcp: the lease (address, server, times), see dhcp.Lease
    # The pool controller's policy that drops the job's traffic or its WAN traffic (from its answer to the
    # registration): the job gets no DNS either, as the forwarder sits before the switch (lark/kernel/dns.py).
    dns_revoked_by: str = ""


@dataclass(frozen=True)
class JobNetwork:
    """A plan with the addresses built for it.

    Reads fall through to the addresses, then to the plan (`net.ipv4`, `net.inbound`, `net.job_id`), so the
    attach and firewall drivers read one object without being able to change either part.
    """
    plan: NetworkPlan
    addrs: Addresses = Addresses()

    def __getattr__(self, name: str):
        # Only called for names that are not fields of JobNetwork itself.
        if name.startswith("__") or name in ("plan", "addrs"):
            raise AttributeError(name)
        addrs = object.__getattribute__(self, "addrs")
        if name in _ADDRESS_FIELDS:
            return getattr(addrs, name)
        return getattr(object.__getattribute__(self, "plan"), name)

    def with_addresses(self, **changes) -> JobNetwork:
        return JobNetwork(self.plan, dataclasses.replace(self.addrs, **changes))

    def to_dict(self) -> dict:
        """The one serialised form: the plan's fields and the addresses' fields side by side."""
        return {**self.plan.to_dict(), **dataclasses.asdict(self.addrs)}

    @classmethod
    def from_dict(cls, d: dict) -> JobNetwork:
        return cls(NetworkPlan.from_dict(d), Addresses(**_known(Addresses, d)))


_ADDRESS_FIELDS = frozenset(f.name for f in dataclasses.fields(Addresses))
