"""lark.controller.ofwire packs flow mods without os-ken's OFPMatch (issue 26 capacity): every kind of flow the
controller installs must come out byte for byte as os-ken encodes it (the encoding the controller used before)."""
import ipaddress

import pytest
from os_ken.ofproto import ofproto_v1_3 as o
from os_ken.ofproto import ofproto_v1_3_parser as p

from lark.controller import flows as fl
from lark.controller import hairpin, ofwire
from lark.controller.flows import Decision, job_flows
from lark.controller.model import JobReg
from lark.controller.ofapp import LarkSwitchApp
from lark.controller.pipeline import ETH_IP, ETH_IP6, T_FORWARD, T_WAN, Flow
from lark.controller.switch import Switch

PORTS = {"ep1": 7, "ep2": 8, "wan0": 1, "wan1": 2}


class Port:
    def __init__(self, name):
        self.name = name.encode()


class DP:
    ofproto, ofproto_parser, id = o, p, 0xC0DE1

    def __init__(self):
        self.ports = {no: Port(name) for name, no in PORTS.items()}


class App:
    """What LarkSwitchApp._mod uses of the app."""
    def _match(self, sw, f):
        return LarkSwitchApp._match(self, sw, f)


def reference(sw: Switch, cookie: int, f: Flow) -> bytes | None:
    """The flow mod as os-ken encodes it (ofapp's encoding before ofwire)."""
    match = dict(f.match)
    if isinstance(match.get("in_port"), str):
        match["in_port"] = sw.ports[match["in_port"]]
    kind = f.action[0]
    out = o.OFPP_NORMAL if kind.endswith("_normal") else sw.ports.get(str(f.action[-1]))
    if kind == "drop":
        inst = []
    elif kind == "goto":
        _, table, md, mask = f.action
        inst = ([p.OFPInstructionWriteMetadata(md, mask)] if mask else []) + [p.OFPInstructionGotoTable(table)]
    elif kind == "normal":
        inst = [p.OFPInstructionActions(o.OFPIT_APPLY_ACTIONS, [p.OFPActionOutput(o.OFPP_NORMAL)])]
    elif kind.startswith("meter"):
        inst = [p.OFPInstructionMeter(f.action[1], o.OFPIT_METER),
                p.OFPInstructionActions(o.OFPIT_APPLY_ACTIONS, [p.OFPActionOutput(out)])]
    elif kind.startswith("queue"):
        inst = [p.OFPInstructionActions(o.OFPIT_APPLY_ACTIONS, [p.OFPActionSetQueue(f.action[1]),
                                                                p.OFPActionOutput(out)])]
    elif kind == "in_port":
        inst = [p.OFPInstructionActions(o.OFPIT_APPLY_ACTIONS, [p.OFPActionOutput(o.OFPP_IN_PORT)])]
    elif kind == "in_port_normal":
        inst = [p.OFPInstructionActions(o.OFPIT_APPLY_ACTIONS, [p.OFPActionOutput(o.OFPP_IN_PORT),
                                                                p.OFPActionOutput(o.OFPP_NORMAL)])]
    elif kind == "output":
        inst = [p.OFPInstructionActions(o.OFPIT_APPLY_ACTIONS, [p.OFPActionOutput(sw.ports[f.action[1]])])]
    msg = p.OFPFlowMod(sw.dp, cookie=cookie, table_id=f.table, priority=f.priority, command=o.OFPFC_ADD,
                       match=p.OFPMatch(**match), instructions=inst)
    msg.set_xid(0x1234)
    msg.serialize()
    return bytes(msg.buf)


def job(n: int, v6: bool = False) -> JobReg:
    addrs = [f"10.77.0.{n}"] + ([f"fd77::{n:x}"] if v6 else [])
    return JobReg.from_wire({"key": f"slot{n}", "job_id": f"{n}.0", "owner": "alice", "addresses": addrs,
                             "mac": f"02:7a:00:00:00:{n:02x}"}, "ep1")


def every_kind_of_flow() -> list[Flow]:
    j, j6 = job(5), job(6, v6=True)
    out = []
    out += job_flows(j, Decision(blocked_by="drop-carol"))
    out += job_flows(j6, Decision(slice_name="s:alice", slice_id=fl.slice_id("s:alice"), wan_action=3), ("ep1",))
    out += job_flows(j, Decision(wan_action=1), ("ep1", "ep2"))
    out += [Flow(T_FORWARD, 400, (("eth_dst", j.mac), ("in_port", "ep1")), ("in_port",)),
            Flow(T_FORWARD, 400, (("eth_dst", hairpin.MULTICAST), ("in_port", "ep2")), ("in_port_normal",))]
    for kind, arg in (("meter_normal", (0x4C00,)), ("meter_output", (0x4C01, "wan1")), ("queue_normal", (3,)),
                      ("queue_output", (4, "wan1")), ("output", ("wan1",)), ("normal", ()), ("drop", ())):
        out.append(Flow(T_WAN, 200, (("eth_type", ETH_IP), ("ipv4_src", "10.77.0.5")), (kind, *arg)))
        out.append(Flow(T_WAN, 200, (("eth_type", ETH_IP6), ("ipv6_src", "fd77::6")), (kind, *arg)))
    for net in (ipaddress.ip_network("10.0.0.0/8"), ipaddress.ip_network("fe80::/10")):
        eth, fld = (ETH_IP, "ipv4_dst") if net.version == 4 else (ETH_IP6, "ipv6_dst")
        out.append(Flow(T_WAN, 300, (("eth_type", eth), ("metadata", (2 << 32, 0xFF << 32)),
                                     (fld, (str(net.network_address), str(net.netmask)))), ("goto", 3, 0, 0)))
    return out


@pytest.mark.parametrize("f", every_kind_of_flow(), ids=lambda f: f.describe()[:80])
def test_a_flow_mod_is_byte_for_byte_os_ken_s(f):
    sw = Switch(DP())
    mod = LarkSwitchApp._mod(App(), sw, 0x4A00_0000_DEAD_BEEF, f)
    assert mod is not None
    mod.set_xid(0x1234)
    mod.serialize()
    assert mod.buf == reference(sw, 0x4A00_0000_DEAD_BEEF, f)


def test_an_unknown_field_falls_back_to_os_ken_and_a_missing_port_installs_nothing():
    sw = Switch(DP())
    f = Flow(T_WAN, 100, (("eth_type", ETH_IP), ("ip_proto", 6), ("tcp_dst", 443)), ("drop",))
    assert ofwire.encode_match(dict(f.match)) is None
    mod = LarkSwitchApp._mod(App(), sw, 1, f)
    mod.set_xid(0x1234)
    mod.serialize()
    assert mod.buf == reference(sw, 1, f)
    assert LarkSwitchApp._mod(App(), sw, 1, Flow(0, 1, (("in_port", "nope"),), ("drop",))) is None
