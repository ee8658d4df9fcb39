"""SciTags (www.scitags.org): the admin's table from job ads to experiment and activity ids, the IPv6 flow label
they make, and the firefly messages that report a flow to a collector. Standard library only: the policy engine,
larkd and the tests share it.

Flow label layout, from the SciTags technical specification (section 1.2, "Implementation of the flow label",
https://docs.google.com/document/d/1x9JsZ7iTj44Ta06IHdkwpv5Q2u4U2QGLWnUeN2Zf5ts) as both reference markers
implement it (flowd's `bitpattern`, flowd-go's `genFlowTag`), label bit 19 = the most significant of the 20:

    19 18 | 17 ............ 9 | 8 | 7 ........ 2 | 1 0
    entropy | experiment id,    | e | activity id  | entropy
            | 9 bits, reversed  |   | 6 bits       |

"reversed": the experiment id's least significant bit is label bit 17. 15 bits carry the tag, 5 the flow's
entropy (draft-cc-v6ops-wlcg-flow-label-marking: "15 bits used for semantics ... and 5 bits for entropy").

The combined integer `scitag = experiment << 6 | activity` is the one FTS, gfal2 and XRootD take
(scitags.org howto); a NetworkPlan carries it, 0 meaning untagged.
"""
from __future__ import annotations

import datetime
import json
import re
import socket
from dataclasses import dataclass

from .errors import LarkError

FIREFLY_PORT = 10514          # flowd's UDP_FIREFLY_PORT, flowd-go's collectorPort default
FIREFLY_VERSION = 1           # firefly.schema.json v1.0.0: "version" minimum 1, maximum 1
EXPERIMENT_BITS, ACTIVITY_BITS = 9, 6
MAX_EXPERIMENT, MAX_ACTIVITY = (1 << EXPERIMENT_BITS) - 1, (1 << ACTIVITY_BITS) - 1
EXPERIMENT_SHIFT, ACTIVITY_SHIFT = 9, 2         # label bit of each field's lowest bit (after reversing)
TAG_MASK = (MAX_EXPERIMENT << EXPERIMENT_SHIFT) | (MAX_ACTIVITY << ACTIVITY_SHIFT)   # 0x3fefc
ENTROPY_MASK = 0xFFFFF & ~TAG_MASK                                                   # 0xc0103: bits 19 18 8 1 0

# RFC 5424 header the collectors parse before the JSON (firefly-collector's logstash grok; flowd, flowd-go):
# <PRI>VERSION TIMESTAMP HOSTNAME APP-NAME PROCID MSGID STRUCTURED-DATA, facility local0, severity informational.
SYSLOG_PRI = (16 << 3) | 6
SYSLOG_MSGID = "firefly-json"

_RULE_RE = re.compile(r"(\d+)\s+(\d+)\s+(\S.*)")


@dataclass(frozen=True)
class Rule:
    """One line of LARK_SCITAGS: jobs whose ad makes `expression` true are tagged (experiment, activity)."""
    experiment: int
    activity: int
    expression: str
    line: int

    @property
    def scitag(self) -> int:
        return combined(self.experiment, self.activity)


def parse_rules(text: str) -> list[Rule]:
    """LARK_SCITAGS: one rule a line, `EXPERIMENT ACTIVITY EXPRESSION`, first true expression wins; blank lines and
    lines starting with # are skipped. The expressions are ClassAd text, parsed by the policy engine."""
    rules = []
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        m = _RULE_RE.fullmatch(line)
        if not m:
            raise LarkError(f"line {number} {line[:80]!r} is not `EXPERIMENT ACTIVITY EXPRESSION`",
                            obj="knob LARK_SCITAGS", fix='write e.g. 2 1 AcctGroup == "group_atlas" (one rule a line)')
        experiment, activity = int(m.group(1)), int(m.group(2))
        if not 1 <= experiment <= MAX_EXPERIMENT or not 0 <= activity <= MAX_ACTIVITY:
            raise LarkError(f"line {number}: experiment {experiment} / activity {activity} do not fit the flow "
                            f"label's {EXPERIMENT_BITS} and {ACTIVITY_BITS} bits", obj="knob LARK_SCITAGS",
                            fix=f"use the registry's ids (api.scitags.org): experiment 1-{MAX_EXPERIMENT}, "
                                f"activity 0-{MAX_ACTIVITY}")
        rules.append(Rule(experiment, activity, m.group(3), number))
    return rules


def combined(experiment: int, activity: int) -> int:
    return experiment << ACTIVITY_BITS | activity


def split(scitag: int) -> tuple[int, int]:
    """(experiment, activity) of a combined scitag."""
    return scitag >> ACTIVITY_BITS, scitag & MAX_ACTIVITY


def _reversed_bits(value: int, width: int) -> int:
    return int(f"{value:0{width}b}"[::-1], 2)


def label_bits(experiment: int, activity: int) -> int:
    """The flow label's 15 tag bits (entropy bits zero)."""
    return (_reversed_bits(experiment, EXPERIMENT_BITS) << EXPERIMENT_SHIFT) | (activity << ACTIVITY_SHIFT)


def tag_of_label(label: int) -> tuple[int, int]:
    """(experiment, activity) a flow label carries: what a collector or router reads back."""
    experiment = _reversed_bits((label >> EXPERIMENT_SHIFT) & MAX_EXPERIMENT, EXPERIMENT_BITS)
    return experiment, (label >> ACTIVITY_SHIFT) & MAX_ACTIVITY


def parse_collector(text: str) -> tuple[str, int]:
    """LARK_SCITAGS_COLLECTOR: "host", "host:port", "[v6]:port" or a bare IPv6 address; port 10514 by default."""
    t = text.strip()
    m = re.fullmatch(r"\[([0-9A-Fa-f:.]+)\](?::(\d+))?|([\w.-]+)(?::(\d+))?|([0-9A-Fa-f:]+:[0-9A-Fa-f:.]*)", t)
    if not m:
        raise LarkError(f"{t!r} is not host, host:port or [ipv6]:port", obj="knob LARK_SCITAGS_COLLECTOR",
                        fix=f'write e.g. "collector.scitags.org:{FIREFLY_PORT}", or "" for no fireflies')
    host = m.group(1) or m.group(3) or m.group(5)
    port = int(m.group(2) or m.group(4) or FIREFLY_PORT)
    if not 0 < port < 65536:
        raise LarkError(f"port {port} is out of 1-65535", obj="knob LARK_SCITAGS_COLLECTOR",
                        fix=f"the collectors listen on {FIREFLY_PORT}")
    return host, port


@dataclass(frozen=True)
class Flow:
    """One of the job's flows as the firefly's flow-id names it: src = the job's side."""
    family: int            # socket.AF_INET or socket.AF_INET6
    protocol: str          # "tcp" or "udp" (the schema's enum)
    src_ip: str
    src_port: int
    dst_ip: str
    dst_port: int


def _iso(t: float) -> str:
    return datetime.datetime.fromtimestamp(t, datetime.UTC).isoformat()


def firefly(state: str, flow: Flow, scitag: int, start: float, now: float, *, end: float | None = None,
            sent: int | None = None, received: int | None = None, application: str = "lark") -> dict:
    """A firefly (schemas/v1.0.0/firefly.schema.json): state "start" or "end"; an end message carries the end
    time and, when known, the flow's bytes sent and received by the job."""
    experiment, activity = split(scitag)
    lifecycle: dict = {"state": state, "start-time": _iso(start), "current-time": _iso(now)}
    if state == "end":
        lifecycle["end-time"] = _iso(end if end is not None else now)
    msg = {
        "version": FIREFLY_VERSION,
        "flow-lifecycle": lifecycle,
        "flow-id": {"afi": "ipv6" if flow.family == socket.AF_INET6 else "ipv4", "src-ip": flow.src_ip,
                    "dst-ip": flow.dst_ip, "protocol": flow.protocol, "src-port": flow.src_port,
                    "dst-port": flow.dst_port},
        "context": {"experiment-id": experiment, "activity-id": activity, "application": application},
    }
    if sent is not None and received is not None:
        msg["usage"] = {"sent": sent, "received": received}
    return msg


def datagram(msg: dict, hostname: str, now: float) -> bytes:
    """The UDP payload: the RFC 5424 header collectors expect, then the firefly's JSON."""
    return (f"<{SYSLOG_PRI}>1 {_iso(now)} {hostname} lark - {SYSLOG_MSGID} - ".encode()
            + json.dumps(msg, separators=(",", ":")).encode())


def firefly_of_datagram(data: bytes) -> dict:
    """The JSON of a datagram `datagram` made (what a collector parses after the syslog header)."""
    return json.loads(data[data.index(b"{"):])
