"""larkd configuration: `LARK_<FIELD>` knobs in HTCondor's configuration, one per field of `Config`.

The knobs are read with the htcondor2 bindings (so `condor_config_val -dump LARK_` shows them and
`condor_reconfig` reloads them); every field of `Config` is a knob, named `LARK_` + the field in capitals, with
no per-field code. A TOML file (`--config FILE`, $LARK_CONFIG, or a former /etc/lark/lark.toml) is still read,
with a deprecation warning naming the knobs to use instead; `lark config migrate` prints them.
"""
from __future__ import annotations

import dataclasses
import ipaddress
import logging
import os
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from .errors import LarkError
from .names import DEFAULT_NETNS_PREFIX
from .scitags import parse_collector, parse_rules

log = logging.getLogger(__name__)
DEFAULT_PATH = "/etc/lark/lark.toml"   # deprecated: LARK_* knobs in the HTCondor configuration replace it
KNOB_PREFIX = "LARK_"
IFNAME_RE = re.compile(r"^[A-Za-z0-9_.-]{1,15}$")


T = TypeVar("T")
# A field's metadata when condor_reconfig may change it while jobs run (lark/daemon/reload.py applies it at once);
# every other field is baked into kernel objects or running jobs, and a change to it needs larkd restarted.
LIVE = {"live": True}


def live(default: T) -> T:
    """A field that condor_reconfig changes at once, with this default."""
    return field(default=default, metadata=LIVE)


@dataclass
class Config:
    # [daemon]
    socket: str = "/run/lark/lark.sock"  # larkd's socket, mode 0666: requests are authorised from SO_PEERCRED
    run_dir: str = "/run/lark"          # records and address locks: same lifetime as the kernel objects
    state_dir: str = "/var/lib/lark"    # finished-job accounting survives reboots
    netns_dir: str = "/run/netns"       # where job namespaces are named (`ip netns` lists them)
    netns_prefix: str = DEFAULT_NETNS_PREFIX  # job namespace names: <prefix><slot key>
    # a job must descend from a root process running one of these
    starter_paths: list[str] = field(default_factory=lambda: ["/usr/sbin/condor_starter"], metadata=LIVE)
    ad_source: str = "startd"           # "startd": the local startd and schedd (htcondor2); "files": ad_dir
    ad_dir: str = "/run/lark/ads"       # ad_source "files": <slot>.job.ad and <slot>.machine.ad, root-owned
    poll_interval: float = live(5.0)    # seconds between counter reads
    request_timeout: float = live(5.0)  # seconds a client has to send its request
    max_request_bytes: int = 65536      # longest request line accepted
    setup_workers: int = 4              # threads that build and tear down job networks
    finished_keep: int = live(10000)    # finished-job records kept in state_dir/finished
    callout: str = live("")             # admin callout run before the policy (docs/policy.md); "" = none
    callout_timeout: float = live(5.0)  # seconds the callout may take
    log_file: str = ""                  # larkd's log (an absolute path; reopened when rotated); "" = stderr
    # Connections one party may hold open at once (issue 14 item 4): a non-root process outside any job, per
    # uid; all such uids together; the processes of one job (under one starter). Root has its own headroom.
    max_connections_per_uid: int = 8    # open connections of one non-root uid outside any job
    max_connections_shared: int = 64    # open connections of all such uids together
    max_connections_per_starter: int = 8  # open connections of the processes of one job (hooks and wrapper too)
    check_min_interval: float = 5.0     # a starter's `check` queries the startd/schedd at most this often (s)
    # larkd pushes each job's figures into its ad at its schedd (htcondor2, as root) this often (s) while it
    # runs, and at its end; 0 = off. Only with ad_source = "startd" (the other source knows no schedd).
    schedd_push_interval: float = 60.0
    schedd_push_retry: float = 600.0    # keep retrying a job's final push this long (s)
    # The job's wrapper stays the job's parent and, when the job ends, waits up to this long (s) for larkd (also
    # while condor_master restarts it) to write the final figures before the job leaves; 0 = no barrier (the
    # wrapper execs the job and the figures come from larkd's periodic and final pushes only). No barrier either
    # when larkd pushes to no schedd (ad_source files, or schedd_push_interval 0).
    exit_barrier_wait: float = live(60.0)
    # The sshd larkd runs for a condor_ssh_to_job session in the job's network namespace, as the job's user (the
    # starter's own configuration file; HTCondor's SSH_TO_JOB_SSHD names the same program for the starter).
    ssh_sshd: str = "/usr/sbin/sshd"
    # Where the real file-transfer plugins are that lark-transfer-plugin wrappers (FILETRANSFER_PLUGINS) stand in
    # for: larkd runs the one of the wrapper's name from here, in the job's network namespace, as the job's user.
    transfer_plugin_dir: str = "/usr/libexec/condor"
    # dockerd's API socket, where larkd asks a docker job's container name (docker_setup, from lark-oci-runtime)
    docker_host: str = live("unix:///run/docker.sock")
    # The sandbox transfer (starter <-> shadow) limited to the slot's Bandwidth, each way: larkd puts each starter
    # in a cgroup v2 of its own and polices its sockets with nft (lark/daemon/sandbox.py, docs/admin.md).
    sandbox_limit: bool = True
    sandbox_cgroup: str = "lark.sandbox"  # the starters' cgroups go under <cgroup2 mount>/<this>
    # Prometheus metrics over HTTP at "host:port" (e.g. "127.0.0.1:9813"); "" = off. Keep it on a local or
    # management address: the figures name slots and running job ids.
    metrics_address: str = ""
    # [network]
    uplink: str = "eth0"                # NAT leaves here; inbound ports arrive here
    subnet: str = "10.213.0.0/16"       # NAT job addresses; .1 is the gateway on every host-side veth
    subnet6: str = ""                   # IPv6 for NAT mode (NAT66), e.g. "fd00:213::/64"; "" = no IPv6
    firewall: str = "nftables"          # or "iptables"
    nft_table: str = "lark"             # the nftables table Lark owns
    allow_job_to_job: bool = False      # jobs on this machine may reach each other
    allow_job_to_host: bool = False     # jobs may reach the host's own addresses
    inbound_ports: str = "20000-20999"  # host ports forwarded to jobs with InboundConnectivity
    enable_ip_forward: bool = True      # larkd sets net.ipv4.ip_forward=1 (NAT needs it)
    # What Lark's firewall does with forwarded traffic that is not a job's: "lark-only" drops it (unless part of
    # an established flow), "any" leaves it, "auto" drops it only when Lark itself turned ip_forward on.
    forward_policy: str = "auto"
    default_network_type: str = live("nat")  # when the machine policy sets no NetworkType
    # The uplink's capacity (Mbit/s) when it reports no speed (virtual NICs): used by detect-bandwidth, and by
    # "fair" for slots without a Bandwidth inventory (before the link speed); 0 = none.
    bandwidth_mbit: int = 0
    # Limit for jobs whose slot was allocated no Bandwidth: "fair" (an equal share of what the running
    # reserved jobs leave of the link, so the sum of limits never exceeds it), "unlimited", "share" (the
    # machine's bandwidth times the slot's share of its cpus), or a number of Mbit/s.
    default_bandwidth: str = live("fair")
    # "fair": the least an unreserved job gets when reservations fill the link (Mbit/s, each direction).
    fair_share_floor_mbit: float = 1.0
    bridge_name: str = "lkbr0"          # bridge mode: created if missing (STP off, forward delay 0), adopted if present
    bridge_uplink: str = ""             # enslaved when Lark creates the bridge; its addresses move to the bridge
    bridge_range: str = ""              # job addresses, "first-last" on the bridged network; "" = no bridge mode
    bridge_prefix: int = 24             # prefix length of the bridged network
    bridge_gateway: str = ""            # default route of bridged jobs
    bridge_range6: str = ""             # bridged IPv6 job addresses, "first-last"; "" = no IPv6 when bridged
    bridge_prefix6: int = 64            # prefix length of the bridged IPv6 network
    bridge_gateway6: str = ""           # IPv6 default route of bridged jobs
    # Isolate each job's bridge port (kernel >= 4.18), pin its MAC there (sticky FDB entry) and send its frames for
    # other jobs of this EP out of bridge_uplink: jobs here then reach each other only through the uplink, where a
    # pool's core switch applies its policies and sends them back (lark-controller `ep_ports`). Without that
    # hairpin, jobs here cannot reach each other at all.
    bridge_isolate_jobs: bool = False
    # Mixed into bridged jobs' MACs so that EPs on one network never hand out the same MAC for equal slot
    # names; "" = this machine's /etc/machine-id. Set it per EP where EPs share a machine id (cloned images).
    job_mac_seed: str = ""
    # IPv6 of bridged/OVS jobs: "static" (bridge_range6) or "slaac" (the site's router advertisements, accepted
    # only from the uplink side; the job's address is EUI-64 of its MAC), and how long to wait for one; or
    # "dhcpv6" (a lease from the site's DHCPv6 server through dhcpcd, routes from its router advertisements).
    bridge_ipv6: str = "static"
    slaac_timeout: float = 5.0          # seconds to wait for a router advertisement (bridge_ipv6 = "slaac")
    dhcpv6_timeout: float = 10.0        # seconds to wait for a DHCPv6 lease and a route (bridge_ipv6 = "dhcpv6")
    dhcp_release: bool = live(False)    # release a job's lease when it ends (else cache it for the slot's next job)
    dhcp_renew_interval: float = live(0.0)  # renew at least this often (s); 0: at the server's T1 only
    ovs_bridge_name: str = "lkovs0"     # Open vSwitch mode ("ovs_bridge"; same addressing knobs as bridge mode)
    ovs_uplink: str = ""                # added to the OVS bridge when Lark creates it
    ovs_db: str = "unix:/var/run/openvswitch/db.sock"  # OVSDB remote
    ovs_rundir: str = "/var/run/openvswitch"   # where ovs-vswitchd puts <bridge>.mgmt
    ovs_datapath: str = "auto"          # "system" (kernel module), "netdev" (userspace), or auto-detect
    # The pool's SDN controller (lark-controller, docs/controller.md): bridged jobs are registered there.
    controller_url: str = ""            # e.g. "https://10.77.0.2:8443"; several (comma-separated): HA; "" = none
    controller_ca: str = "/etc/lark/controller/ca.pem"    # the CA that signed the controller's certificate
    controller_cert: str = "/etc/lark/controller/ep.pem"  # this EP's client certificate (its name = the EP)
    controller_key: str = "/etc/lark/controller/ep.key"   # the key of controller_cert (root-only file)
    # The controller's certificate must name this (or the controller_url's host): an EP's certificate from the
    # same CA can then not pose as the controller.
    controller_name: str = "controller"
    controller_timeout: float = 2.0     # seconds to wait for the controller's acknowledgement of a job's flows
    controller_failure: str = "closed"  # controller unreachable: "closed" refuses the job, "open" starts it
    controller_resync: float = 30.0     # seconds between full resyncs of this EP's job list (and after restarts)
    controller_attributes: list[str] = field(default_factory=list)  # job ad attributes the SDN policies name
    # DNS: jobs share the host's resolv.conf; loopback nameservers in it (systemd-resolved's 127.0.0.53, a local
    # cache on 127.0.0.1) are steered to a host-side forwarder on dns_address (lark/kernel/dns.py).
    resolv_conf: str = "/etc/resolv.conf"
    dns_forward: bool = True            # steer jobs' DNS for loopback resolvers to the host-side forwarder
    dns_address: str = "169.254.53.53"  # link-local service address of the forwarder (a Lark-owned device)
    # The user both DNS dnsmasqs (forwarder, ::1 relays) run as: no job may run as it, or the job could signal
    # them. larkd creates it (system user, own group) when it is missing.
    dns_user: str = "lark-dns"
    # DNS queries (UDP datagrams, TCP connections) per second each job may send the forwarder, in bursts of twice
    # that; the rest is dropped, so one job cannot fill the forwarder's table of pending queries. 0 = no limit.
    dns_query_rate: int = 20
    # MTU of the job's link: 0 follows the uplink (bridge/OVS) or the route out (NAT); a number overrides it.
    job_mtu: int = 0
    # SciTags (docs/admin.md "SciTags"): one rule a line, `EXPERIMENT ACTIVITY EXPRESSION`, the expression a ClassAd
    # expression on the job ad; the first true one tags the job, whose IPv6 flows then carry the two ids in their
    # flow label. "" = off.
    scitags: str = ""
    # Where larkd sends fireflies (the SciTags UDP messages) for tagged jobs' flows: "host" or "host:port" (port
    # 10514); "" = none.
    scitags_collector: str = ""

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

    def validate(self) -> Config:
        def bad(key: str, why: str, fix: str) -> LarkError:
            return LarkError(why, obj=f"config key {key!r} (knob {knob_name(key)})", fix=fix)

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
        if not re.fullmatch(r"[A-Za-z0-9_.-]{1,64}", self.sandbox_cgroup) or self.sandbox_cgroup in (".", ".."):
            raise bad("sandbox_cgroup", f"{self.sandbox_cgroup!r} is not a cgroup name",
                      "one directory name: letters, digits, _ . -")
        if not re.fullmatch(r"[A-Za-z0-9_.-]{1,40}", self.netns_prefix):
            raise bad("netns_prefix", f"{self.netns_prefix!r} is not a safe name prefix", "letters, digits, _.-")
        try:
            lo, hi = self.port_range
        except ValueError:
            raise bad("inbound_ports", f"{self.inbound_ports!r} is not a range", "write it as 20000-20999") from None
        if not (1 <= lo <= hi <= 65535):
            raise bad("inbound_ports", f"{self.inbound_ports!r} is out of 1-65535", "write it as 20000-20999")
        if self.log_file and not os.path.isabs(self.log_file):
            raise bad("log_file", f"{self.log_file!r} is not an absolute path", "e.g. $(LOG)/LarkdLog")
        for key in ("max_connections_per_uid", "max_connections_shared", "max_connections_per_starter"):
            if not 1 <= int(getattr(self, key)) <= 1000:
                raise bad(key, f"{getattr(self, key)!r} is out of 1-1000", "use a small number such as 8")
        if self.schedd_push_interval < 0 or self.schedd_push_retry < 0:
            raise bad("schedd_push_interval", "must not be negative", "use seconds, e.g. 60; 0 turns pushing off")
        if not os.path.isabs(self.ssh_sshd):
            raise bad("ssh_sshd", f"{self.ssh_sshd!r} is not an absolute path",
                      "name the sshd program, e.g. /usr/sbin/sshd (what SSH_TO_JOB_SSHD names)")
        if not os.path.isabs(self.transfer_plugin_dir):
            raise bad("transfer_plugin_dir", f"{self.transfer_plugin_dir!r} is not an absolute path",
                      "name HTCondor's plugin directory, e.g. /usr/libexec/condor (its LIBEXEC)")
        if not 0 <= self.exit_barrier_wait <= 3600:
            raise bad("exit_barrier_wait", f"{self.exit_barrier_wait!r} is out of 0-3600",
                      "use seconds, e.g. 60 (longer than condor_master takes to restart larkd); 0 turns it off")
        if self.check_min_interval < 0:
            raise bad("check_min_interval", "must not be negative", "use seconds, e.g. 5")
        if self.poll_interval <= 0 or self.request_timeout <= 0:
            raise bad("poll_interval", "intervals must be positive", "use seconds, e.g. 5")
        if self.default_network_type not in ("nat", "bridge", "ovs_bridge", "none"):
            raise bad("default_network_type", f"{self.default_network_type!r} is not available",
                      "use nat, bridge, ovs_bridge or none")
        for key in ("bridge_name", "bridge_uplink", "ovs_bridge_name", "ovs_uplink"):
            v = getattr(self, key)
            if (v or key.endswith("_name")) and not IFNAME_RE.fullmatch(v):
                raise bad(key, f"{v!r} is not a valid interface name", "use a name `ip link` would accept")
        if not isinstance(self.bridge_isolate_jobs, bool):
            raise bad("bridge_isolate_jobs", f"{self.bridge_isolate_jobs!r} is not true or false",
                      "set true on EPs behind a core switch that hairpins (lark-controller ep_ports), else false")
        if self.bridge_isolate_jobs and not self.bridge_uplink:
            raise bad("bridge_isolate_jobs", "isolated jobs reach each other through the uplink, and bridge_uplink "
                      "is not set", "set bridge_uplink to the bridge's port toward the core switch, e.g. eth0")
        if not re.fullmatch(r"[A-Za-z0-9_.:@-]{0,64}", self.job_mac_seed):
            raise bad("job_mac_seed", f"{self.job_mac_seed!r} is not a plain name", "letters, digits and _.:@-")
        if self.ovs_datapath not in ("auto", "system", "netdev"):
            raise bad("ovs_datapath", f"unknown datapath {self.ovs_datapath!r}", "use auto, system or netdev")
        if not re.fullmatch(r"(unix:|tcp:|ssl:)[\w./:\[\]-]+", self.ovs_db):
            raise bad("ovs_db", f"{self.ovs_db!r} is not an OVSDB remote", "e.g. unix:/var/run/openvswitch/db.sock")
        if self.bridge_range:
            try:
                first, last = (ipaddress.IPv4Address(x.strip()) for x in self.bridge_range.split("-"))
                gw = ipaddress.IPv4Address(self.bridge_gateway)
                net = ipaddress.IPv4Network(f"{gw}/{self.bridge_prefix}", strict=False)
            except ValueError as e:
                raise bad("bridge_range", f"{self.bridge_range!r} with gateway {self.bridge_gateway!r}: {e}",
                          'write bridge_range = "192.0.2.100-192.0.2.199" and bridge_gateway = "192.0.2.1"') \
                    from None
            if not (first <= last and first in net and last in net) or first <= gw <= last:
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
        for url in re.split(r"[,\s]+", self.controller_url.strip()) if self.controller_url.strip() else []:
            if not re.fullmatch(r"https://[\w.\[\]:-]+(:\d+)?/?", url):
                raise bad("controller_url", f"{url!r} is not an https URL",
                          'write e.g. "https://10.77.0.2:8443" (mutual TLS), several separated by commas for '
                          'controllers in HA (docs/controller.md), or "" for no controller')
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
        try:
            dns_addr = ipaddress.IPv4Address(self.dns_address)
        except ValueError as e:
            raise bad("dns_address", str(e), 'give an unused IPv4 address, e.g. "169.254.53.53"') from None
        if dns_addr.is_loopback or dns_addr.is_unspecified or dns_addr in self.network:
            raise bad("dns_address", f"{dns_addr} is loopback, unspecified or inside subnet {self.subnet}",
                      'use a link-local address outside every job network, e.g. "169.254.53.53"')
        if self.dns_forward and (not self.dns_user or self.dns_user in ("root", "nobody")):
            raise bad("dns_user", f"the DNS forwarder may not run as {self.dns_user!r}: jobs (or everyone) run as it",
                      'use a system user no job runs as, e.g. "lark-dns" (larkd creates it when it is missing)')
        if self.dns_query_rate < 0:
            raise bad("dns_query_rate", f"{self.dns_query_rate} is negative", "use queries per second, 0 = no limit")
        if not os.path.isabs(self.resolv_conf):
            raise bad("resolv_conf", f"{self.resolv_conf!r} is not an absolute path", "e.g. /etc/resolv.conf")
        if self.bridge_ipv6 not in ("static", "slaac", "dhcpv6"):
            raise bad("bridge_ipv6", f"unknown IPv6 addressing {self.bridge_ipv6!r}",
                      'use "static", "slaac" or "dhcpv6"')
        if not 0 < self.slaac_timeout <= 60:
            raise bad("slaac_timeout", f"{self.slaac_timeout} is not a wait", "use seconds, e.g. 5")
        if not 1 <= self.dhcpv6_timeout <= 120:
            raise bad("dhcpv6_timeout", f"{self.dhcpv6_timeout} is not a wait", "use seconds, e.g. 10")
        if self.job_mtu and not 576 <= self.job_mtu <= 65535:
            raise bad("job_mtu", f"{self.job_mtu} is not an MTU", "use 0 (follow the uplink) or 576-65535")
        parse_rules(self.scitags)
        if self.scitags_collector:
            parse_collector(self.scitags_collector)
        self.default_bandwidth = str(self.default_bandwidth)
        if self.metrics_address:
            host, sep, port = self.metrics_address.rpartition(":")
            if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
                raise bad("metrics_address", f"{self.metrics_address!r} is not host:port",
                          'use e.g. "127.0.0.1:9813" or "[::1]:9813", or "" to turn metrics off')
        if self.forward_policy not in ("auto", "lark-only", "any"):
            raise bad("forward_policy", f"{self.forward_policy!r} is not a policy", 'use "auto", "lark-only" or "any"')
        if self.default_bandwidth not in ("fair", "unlimited", "share"):
            try:
                mbit = float(self.default_bandwidth)
            except ValueError:
                mbit = -1.0
            if not 0 < mbit <= 10_000_000:
                raise bad("default_bandwidth", f"{self.default_bandwidth!r} is not a limit",
                          'use "fair", "unlimited", "share" or a number of Mbit/s such as "100"')
        try:
            floor = float(self.fair_share_floor_mbit)
        except (TypeError, ValueError):
            floor = -1.0
        if not 0 < floor <= 10_000_000:
            raise bad("fair_share_floor_mbit", f"{self.fair_share_floor_mbit!r} is not a rate",
                      "use a number of Mbit/s above 0, such as 1")
        return self


_FIELDS = {f.name: f for f in dataclasses.fields(Config)}
# Fields whose users read them from the shared Config object each time (the poller, request handling, the
# policy engine, DHCP renewal, finished-record pruning): on SIGHUP (lark.daemon.reload), assigning them on the
# live object is enough; the rest need a restart. Here, with the fields, so the knob table can say which is which.
# The knobs that condor_reconfig changes at once (larkd reads them afresh on every use): the fields marked live.
LIVE_FIELDS = frozenset(f.name for f in dataclasses.fields(Config) if f.metadata.get("live"))


def from_mapping(data: dict, path: str = "config") -> Config:
    flat: dict = {}
    for section, values in data.items():
        if not isinstance(values, dict):
            raise LarkError(f"top-level key {section!r} must be a table", obj=path,
                            fix="put keys under [daemon] or [network]")
        for key, value in values.items():
            if key not in _FIELDS:
                raise LarkError(f"unknown key {section}.{key}", obj=path, fix="see docs/admin.md for the keys")
            flat[key] = value
    return Config(**flat).validate()


def knob_name(field_name: str) -> str:
    return KNOB_PREFIX + field_name.upper()


_DEFAULTS = Config()


def parse_knob(name: str, text: str):
    """A knob's text as the type of the field's default (HTCondor's conventions for booleans and lists)."""
    kind = type(getattr(_DEFAULTS, name))
    t = text.strip()
    try:
        if kind is bool:
            low = t.lower()
            if low not in ("true", "false", "1", "0", "yes", "no"):
                raise ValueError(t)
            return low in ("true", "1", "yes")
        if kind is int:
            return int(t)
        if kind is float:
            return float(t)
        if kind is list:
            return [x for x in re.split(r"[,\s]+", t) if x]
    except ValueError:
        raise LarkError(f"{t!r} is not {'a boolean' if kind is bool else 'an integer' if kind is int else 'a number'}",
                        obj=f"knob {knob_name(name)}", fix=f"see {knob_name(name)} in docs/admin.md") from None
    return t


def condor_knobs(param=None) -> dict[str, str]:
    """The LARK_<FIELD> knobs set in HTCondor's configuration, as text, keyed by field name."""
    if param is None:
        import htcondor2  # only larkd and the admin tools: the job's side stays standard library
        param = htcondor2.param
    out = {}
    for name in _FIELDS:
        value = param.get(knob_name(name))
        if value is not None:
            out[name] = str(value)
    return out


def from_knobs(knobs: dict[str, str], base: dict | None = None) -> Config:
    values = dict(base or {})
    values.update({name: parse_knob(name, text) for name, text in knobs.items()})
    return Config(**values).validate()


def _toml_values(path: str) -> dict:
    p = Path(path)
    try:
        data = tomllib.loads(p.read_text())
    except FileNotFoundError:
        raise LarkError("file does not exist", obj=f"config {path}", fix="create it or drop --config") from None
    except tomllib.TOMLDecodeError as e:
        raise LarkError(f"not valid TOML: {e}", obj=f"config {path}", fix="fix the syntax") from None
    return dataclasses.asdict(from_mapping(data, path))


def _warn_deprecated(path: str, values: dict) -> None:
    changed = sorted(k for k, v in values.items() if getattr(_DEFAULTS, k) != v)
    log.warning("%s is deprecated: set these in HTCondor's configuration instead (`lark config migrate` prints "
                "them): %s", path, ", ".join(knob_name(k) for k in changed) or "(nothing differs from defaults)")


def load(path: str | None = None, *, condor: bool = True, warn: bool = True) -> Config:
    """The configuration: an explicit TOML file (`--config`, $LARK_CONFIG) alone, else the LARK_* knobs of
    HTCondor's configuration over a former /etc/lark/lark.toml (knobs win). `condor=False` skips the HTCondor
    configuration (the job's side: no bindings to import)."""
    explicit = path or os.environ.get("LARK_CONFIG")
    if explicit:
        values = _toml_values(explicit)
        if warn:
            _warn_deprecated(explicit, values)
        return Config(**values).validate()
    values = {}
    if os.path.exists(DEFAULT_PATH):
        values = _toml_values(DEFAULT_PATH)
        if warn:
            _warn_deprecated(DEFAULT_PATH, values)
    return from_knobs(condor_knobs() if condor else {}, values)


def knob_lines(cfg: Config, only_changed: bool = True) -> list[str]:
    """`LARK_<FIELD> = value` lines for a condor_config.d file (what `lark config migrate` prints)."""
    lines = []
    for f in dataclasses.fields(cfg):
        v = getattr(cfg, f.name)
        if only_changed and v == getattr(_DEFAULTS, f.name):
            continue
        text = ("true" if v else "false") if isinstance(v, bool) else ", ".join(v) if isinstance(v, list) else v
        lines.append(f"{knob_name(f.name)} = {text}")
    return lines


def field_docs() -> dict[str, str]:
    """Each field's comment in the Config class (the one after it, else the lines above it): the knob's doc."""
    import inspect
    docs: dict[str, str] = {}
    pending: list[str] = []
    for line in inspect.getsource(Config).splitlines():
        comment = re.fullmatch(r"    # (.*)", line)
        field_line = re.fullmatch(r"    (\w+): [^=]+=.*?(?:\s{2,}# (.*))?", line)
        if comment and not re.fullmatch(r"\[\w+\]", comment.group(1)):
            pending.append(comment.group(1).strip())
        elif field_line and field_line.group(1) in _FIELDS:
            # A field's own trailing comment is its doc; a comment block above it documents it only when it
            # has none (a block above several fields is their heading).
            docs[field_line.group(1)] = (field_line.group(2) or " ".join(pending)).strip()
            pending = []
        else:
            pending = []
    return docs


def knob_table() -> str:
    """The markdown table of every knob with its default, generated from Config (docs/admin.md holds a copy
    that a unit test compares with this, so the two cannot drift)."""
    docs = field_docs()
    rows = ["| knob | default | live on reconfig | what it does |", "|---|---|---|---|"]
    for f in dataclasses.fields(Config):
        default = knob_lines(_DEFAULTS, only_changed=False)[[x.name for x in dataclasses.fields(Config)].index(f.name)]
        value = default.partition(" = ")[2]
        rows.append(f"| `{knob_name(f.name)}` | {f'`{value}`' if value else '(empty)'} | "
                    f"{'yes' if f.name in LIVE_FIELDS else 'restart'} | {docs.get(f.name, '').replace('|', '/')} |")
    return "\n".join(rows) + "\n"


def dump(cfg: Config) -> str:
    """Render a config as TOML (used by tests and the testbed to write config files)."""
    daemon_keys = {"socket", "run_dir", "state_dir", "netns_dir", "netns_prefix", "starter_paths", "ad_source",
                   "ad_dir", "poll_interval", "request_timeout", "max_request_bytes", "setup_workers",
                   "finished_keep", "callout", "callout_timeout"}
    out: dict[str, list[str]] = {"daemon": [], "network": []}
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
