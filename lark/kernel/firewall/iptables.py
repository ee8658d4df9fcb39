"""iptables backend for sites whose firewall is iptables-managed.

Lark owns only chains named LARK-* and one jump rule from each built-in chain it needs. Per-job objects are
chains (LARK-<key>-PRE/OUT/IN/DNAT, and DOUT/DIN for its DNS to the host's forwarder) entered by jump rules with
fixed specs, so removal needs no rule numbers. Same behaviour as the nftables backend; counters are the sums of the
job chains' ACCEPT (and, for DNS answers, RETURN) rule counters.
"""
from __future__ import annotations

import logging
import re

from ...errors import LarkError
from ...names import HOST_IF_PREFIX, KEY_PATTERN, JobNames
from ...plan import JobNetwork
from .. import forwarding
from ..drift import Finding, drifted, present
from .base import ROUTED, SWITCHED, Counters, Firewall, dns_allowed, run_tool

log = logging.getLogger(__name__)
WILD = HOST_IF_PREFIX + "+"
BASE = [  # (table, built-in chain, our chain)
    ("raw", "PREROUTING", "LARK-PRE"),
    ("filter", "FORWARD", "LARK-FWD"),
    ("filter", "INPUT", "LARK-INPUT"),
    ("filter", "OUTPUT", "LARK-OUTPUT"),  # per job: DNS answers to it, counted (LARK-<key>-DIN)
    ("nat", "PREROUTING", "LARK-DNAT"),
    ("nat", "POSTROUTING", "LARK-POST"),
]
JOB_CHAIN_RE = re.compile(rf"^LARK-({KEY_PATTERN})-(PRE|OUT|IN|DNAT|DOUT|DIN)$")
# DNS queries to the host's forwarder (lark/kernel/dns.py) from job devices go here, then to the job's own DOUT
# chain; a job without one (no outbound connectivity) returns to LARK-INPUT's drop. Not flushed by ensure_base: it
# holds per-job jumps, which must survive a larkd restart.
DNS_CHAIN = "LARK-DNS"
EST = ["-m", "conntrack", "--ctstate", "ESTABLISHED,RELATED"]
NEW = ["-m", "conntrack", "--ctstate", "NEW"]
IPT_FIX = ("something other than larkd changed Lark's LARK-* chains (`iptables -F/-X/-D`, a firewall manager "
           "that reloads the whole ruleset)")


class IptablesFirewall(Firewall):
    name = "iptables"

    def _ipt(self, table: str, *args: str, check: bool = True, v6: bool = False):
        return run_tool(["ip6tables" if v6 else "iptables", "-w", "5", "-t", table, *args],
                        what=f"iptables -t {table} {' '.join(args[:2])}", check=check)

    def _restore(self, text: str, what: str) -> None:
        run_tool(["iptables-restore", "-w", "5", "--noflush"], input=text, what=what)

    def _save(self, table: str) -> list[str]:
        cp = run_tool(["iptables-save", "-c", "-t", table], what=f"iptables-save -t {table}", check=False)
        return cp.stdout.splitlines() if cp.returncode == 0 else []

    def _chains(self, table: str) -> set[str]:
        return {line[1:].split()[0] for line in self._save(table) if line.startswith(":")}

    # -- shared objects -------------------------------------------------------------------------------
    def ensure_base(self) -> None:
        cfg = self.cfg
        for table, parent, chain in BASE:
            if chain not in self._chains(table):
                self._ipt(table, "-N", chain)
            if self._ipt(table, "-C", parent, "-j", chain, check=False).returncode != 0:
                self._ipt(table, "-I", parent, "1", "-j", chain)
        if DNS_CHAIN not in self._chains("filter"):
            self._ipt("filter", "-N", DNS_CHAIN)
        # Chains without per-job content are rebuilt from config every time.
        self._ipt("filter", "-F", "LARK-INPUT")
        if cfg.dns_forward:
            for proto in ("udp", "tcp"):
                self._ipt("filter", "-A", "LARK-INPUT", "-i", WILD, "-d", cfg.dns_address, "-p", proto,
                          "--dport", "53", "-j", DNS_CHAIN)
        self._ipt("filter", "-A", "LARK-INPUT", "-i", WILD, *EST, "-j", "ACCEPT")
        if not cfg.allow_job_to_host:
            self._ipt("filter", "-A", "LARK-INPUT", "-i", WILD, "-j", "DROP")
        self._ipt("nat", "-F", "LARK-POST")
        self._ipt("nat", "-A", "LARK-POST", "-o", cfg.uplink, "-s", cfg.subnet, "-j", "MASQUERADE")
        # Catch-all drops for job interfaces that have no rules (yet): appended once, kept last.
        for table, chain, rule in (("raw", "LARK-PRE", ["-i", WILD, "-j", "DROP"]),
                                   ("filter", "LARK-FWD", ["-i", WILD, "-j", "DROP"]),
                                   ("filter", "LARK-FWD", ["-o", WILD, "-j", "DROP"])):
            if self._ipt(table, "-C", chain, *rule, check=False).returncode != 0:
                self._ipt(table, "-A", chain, *rule)
        # The host routes for Lark's jobs only (their jumps are inserted above these), not for anyone.
        fwd_rules = [[*EST, "-j", "ACCEPT"], ["-j", "DROP"]]
        if cfg.bridge_range:  # bridged across Lark's bridge (br_netfilter): not routing, see nftables.py
            fwd_rules.insert(1, ["-i", cfg.bridge_name, "-o", cfg.bridge_name, "-j", "ACCEPT"])
        lark_only = forwarding.lark_only(cfg)
        for rule in fwd_rules:
            while self._ipt("filter", "-D", "LARK-FWD", *rule, check=False).returncode == 0:
                pass  # rebuilt from config each time, and kept last
        if lark_only:
            for rule in fwd_rules:
                self._ipt("filter", "-A", "LARK-FWD", *rule)
        # No job gets IPv6 in NAT mode: drop it at the door.
        rule = ["PREROUTING", "-i", WILD, "-j", "DROP"]
        if self._ipt("raw", "-C", *rule, check=False, v6=True).returncode != 0:
            self._ipt("raw", "-I", *rule[:1], "1", *rule[1:], v6=True)

    def destroy_base(self) -> None:
        for key in self.job_keys():
            self.remove_job(JobNames(key))
        for table, parent, chain in BASE:
            self._ipt(table, "-D", parent, "-j", chain, check=False)
            self._ipt(table, "-F", chain, check=False)
            self._ipt(table, "-X", chain, check=False)
        self._ipt("filter", "-F", DNS_CHAIN, check=False)  # after LARK-INPUT, which jumps to it
        self._ipt("filter", "-X", DNS_CHAIN, check=False)
        self._ipt("raw", "-D", "PREROUTING", "-i", WILD, "-j", "DROP", check=False, v6=True)

    def base_present(self) -> bool:
        return any(chain in self._chains(table) for table, _, chain in BASE)

    # -- per job --------------------------------------------------------------------------------------
    def _job_jumps(self, names: JobNames) -> list[tuple[str, str, list[str], str]]:
        k, hif = names.key, names.host_if
        return [
            ("raw", "LARK-PRE", ["-i", hif, "-g", f"LARK-{k}-PRE"], f"LARK-{k}-PRE"),
            ("filter", "LARK-FWD", ["-i", hif, "-g", f"LARK-{k}-OUT"], f"LARK-{k}-OUT"),
            ("filter", "LARK-FWD", ["-o", hif, "-g", f"LARK-{k}-IN"], f"LARK-{k}-IN"),
            ("nat", "LARK-DNAT", ["-j", f"LARK-{k}-DNAT"], f"LARK-{k}-DNAT"),
            ("filter", DNS_CHAIN, ["-i", hif, "-g", f"LARK-{k}-DOUT"], f"LARK-{k}-DOUT"),
            ("filter", "LARK-OUTPUT", ["-o", hif, "-s", self.cfg.dns_address, "-j", f"LARK-{k}-DIN"],
             f"LARK-{k}-DIN"),
        ]

    def add_job(self, plan: JobNetwork, names: JobNames, rules: str) -> None:
        text = self.job_rules(plan, names, rules)
        if text:
            self._restore(text, f"iptables rules of job {plan.job_id} ({names.host_if})")

    def job_rules(self, plan: JobNetwork, names: JobNames, rules: str) -> str:
        """The iptables-restore text add_job applies for this job (empty: nothing): what verify_job reads back."""
        if rules == SWITCHED:
            return ""  # switched by OVS, outside netfilter: its rules are OpenFlow (attach/ovs.py)
        if plan.ipv6:
            raise LarkError("IPv6 jobs need the nftables firewall backend", job=plan.job_id,
                            obj="firewall = iptables", fix="set LARK_FIREWALL = nftables")
        if rules != ROUTED:
            # Bridged frames need ebtables-style filtering; Lark does that with nftables' bridge family only.
            raise LarkError(f"{plan.network_type} mode needs the nftables firewall backend", job=plan.job_id,
                            obj="firewall = iptables", fix="set LARK_FIREWALL = nftables")
        cfg, k = self.cfg, names.key
        up = cfg.uplink

        def line(*a: str) -> str:
            return " ".join(a)

        def direction(chain: str, new_allowed: bool, dev: str) -> list[str]:
            """One direction's chain: replies pass, new connections through the uplink when allowed."""
            rules = [f":{chain} - [0:0]", line("-A", chain, *EST, "-j", "ACCEPT")]
            if new_allowed:
                rules.append(line("-A", chain, dev, up, *NEW, "-j", "ACCEPT"))
            if cfg.allow_job_to_job:
                rules.append(line("-A", chain, dev, WILD, "-j", "ACCEPT"))
            return [*rules, line("-A", chain, "-j", "DROP")]

        out = direction(f"LARK-{k}-OUT", plan.outbound, "-o")
        inn = direction(f"LARK-{k}-IN", plan.inbound, "-i")
        dnat = [f":LARK-{k}-DNAT - [0:0]"]
        if plan.inbound and plan.inbound_port:
            for proto in ("tcp", "udp"):
                dnat.append(line("-A", f"LARK-{k}-DNAT", "-i", up, "-p", proto, "--dport", str(plan.inbound_port),
                                 "-j", "DNAT", "--to-destination", f"{plan.ipv4}:{plan.inbound_port}"))
        dns: list[str] = []
        jumps: dict[str, list[str]] = {t: [] for t in ("raw", "filter", "nat")}
        for table, parent, spec, chain in self._job_jumps(names):
            if chain.endswith(("-DOUT", "-DIN")):
                if not dns_allowed(cfg, plan):
                    continue
                dns.append(f":{chain} - [0:0]")
            jumps[table].append(line("-I", parent, "1", *spec))
        if dns:
            dout, din = f"LARK-{k}-DOUT", f"LARK-{k}-DIN"
            rate = cfg.dns_query_rate
            # UDP datagrams and TCP connection attempts are queries, limited per job (this chain's own limit);
            # the rest of a TCP connection passes. Each accepted packet is counted as the job's.
            dns.append(line("-A", dout, "-p", "tcp", "!", "--syn", "-j", "ACCEPT"))
            if rate:
                dns.append(line("-A", dout, "-m", "limit", "--limit", f"{rate}/second", "--limit-burst",
                                str(2 * rate), "-j", "ACCEPT"))
                dns.append(line("-A", dout, "-j", "DROP"))
            else:
                dns.append(line("-A", dout, "-j", "ACCEPT"))
            dns.append(line("-A", din, "-j", "RETURN"))  # only counts: the host's own output policy decides
        text = "\n".join([
            "*raw", f":LARK-{k}-PRE - [0:0]", line("-A", f"LARK-{k}-PRE", "!", "-s", plan.ipv4, "-j", "DROP"),
            *jumps["raw"], "COMMIT",
            "*filter", *out, *inn, *dns, *jumps["filter"], "COMMIT",
            "*nat", *dnat, *jumps["nat"], "COMMIT", ""])
        return text

    def verify_job(self, plan: JobNetwork, names: JobNames, rules: str) -> list[Finding]:
        """The chains of job_rules with as many rules as it gives them, and its jumps into them (`iptables -C`)."""
        want: dict[tuple[str, str], int] = {}
        jumps: list[tuple[str, str, list[str]]] = []
        table = ""
        for line in self.job_rules(plan, names, rules).splitlines():
            if line.startswith("*"):
                table = line[1:]
            elif line.startswith(":"):
                want[(table, line[1:].split()[0])] = 0
            elif line.startswith("-A "):
                want[(table, line.split()[1])] += 1
            elif line.startswith("-I "):
                _, parent, _, *spec = line.split()
                jumps.append((table, parent, spec))
        saved = {t: self._save(t) for t in {t for t, _ in want}}
        found = []
        for (table, chain), n in want.items():
            what = f"iptables chain {table} {chain}"
            if not any(line.startswith(f":{chain} ") for line in saved[table]):
                found.append(drifted(what, "the chain is gone", IPT_FIX))
                continue
            have = sum(1 for line in saved[table] if re.match(rf"^(\[\d+:\d+\] )?-A {re.escape(chain)} ", line))
            found.append(present(what) if have == n else drifted(what, f"{have} rule(s) where setup put {n}", IPT_FIX))
        for table, parent, spec in jumps:
            what = f"iptables jump {table} {parent} {' '.join(spec)}"
            there = self._ipt(table, "-C", parent, *spec, check=False).returncode == 0
            found.append(present(what) if there else drifted(what, "the jump into the job's chain is gone", IPT_FIX))
        return found

    def remove_job(self, names: JobNames) -> Counters | None:
        found = False
        final = self.read_counters().get(names.key)
        existing = {t: self._chains(t) for t in ("raw", "filter", "nat")}
        for table, parent, spec, chain in self._job_jumps(names):
            while self._ipt(table, "-D", parent, *spec, check=False).returncode == 0:
                found = True
            if chain in existing[table]:
                self._ipt(table, "-F", chain, check=False)
                self._ipt(table, "-X", chain, check=False)
                found = True
        return (final or Counters()) if found else None

    def read_counters(self) -> dict[str, Counters]:
        out: dict[str, Counters] = {}
        for line in self._save("filter"):
            m = re.match(r"^\[(\d+):(\d+)\] -A (\S+) .*-j (ACCEPT|RETURN)$", line)  # job chains: JOB_CHAIN_RE
            if not m:
                continue
            jm = JOB_CHAIN_RE.match(m.group(3))
            if not jm or (jm.group(2), m.group(4)) not in (("OUT", "ACCEPT"), ("IN", "ACCEPT"), ("DOUT", "ACCEPT"),
                                                           ("DIN", "RETURN")):
                continue
            c = out.setdefault(jm.group(1), Counters())
            if jm.group(2) in ("OUT", "DOUT"):
                c.packets_out += int(m.group(1))
                c.bytes_out += int(m.group(2))
            else:
                c.packets_in += int(m.group(1))
                c.bytes_in += int(m.group(2))
        for table in ("raw", "filter", "nat"):
            for chain in self._chains(table):
                jm = JOB_CHAIN_RE.match(chain)
                if jm:
                    out.setdefault(jm.group(1), Counters())
        return out

    def job_keys(self) -> set[str]:
        keys = set()
        for table in ("raw", "filter", "nat"):
            for chain in self._chains(table):
                jm = JOB_CHAIN_RE.match(chain)
                if jm:
                    keys.add(jm.group(1))
        return keys
