"""Policy compilation (job ads -> flow specs), the registry, registrations, config and larkd's client errors."""
import dataclasses
import logging
import socket

import pytest

from lark.config import Config
from lark.controller import config as ccfg
from lark.controller.flows import (ETH_IP, SLICE_MASK, T_SLICE, T_SOURCE, T_WAN, WAN_DROP, WAN_SHIFT, base_flows,
                                   decide, job_flows)
from lark.controller.model import COOKIE_TAG_MASK, JOB_COOKIE_TAG, JobReg
from lark.controller.registry import Registry
from lark.daemon.controller_client import ControllerClient, registration
from lark.errors import LarkError
from lark.plan import Addresses, JobNetwork, NetworkPlan

POLICIES = {
    "policy": [
        {"name": "blocked", "kind": "drop", "select": 'member(Owner, {"mallory", "trudy"})'},
        {"name": "slices", "kind": "slice", "select": "ProjectName =!= \"open\""},
        {"name": "students", "kind": "wan_drop", "select": 'AcctGroup =?= "students"'},
        {"name": "cms", "kind": "wan_steer", "select": 'regexp("^cms", AcctGroup ?: "")', "port": "wan1"},
    ],
    "switch": {"wan_ports": ["wan0", "wan1"], "site_prefixes": ["10.77.0.0/16", "fd77::/64"]},
}


def cfg(**extra):
    return ccfg.from_mapping({**POLICIES, **extra})


def job(n=1, owner="alice", group="", ep="ep1", addrs=None, **attrs):
    return JobReg.from_wire({"key": f"slot{n}", "job_id": f"{n}.0", "owner": owner, "accounting_group": group,
                             "addresses": addrs or [f"10.77.1.{n}"], "mac": f"02:00:00:00:00:{n:02x}",
                             "attrs": attrs}, ep)


def test_policies_decide_by_classad_expression():
    c = cfg()
    assert decide(job(owner="mallory"), c).blocked_by == "blocked"
    d = decide(job(owner="alice", group="cms_prod"), c)
    assert (d.blocked_by, d.slice_name, d.wan_policy, d.wan_action) == ("", "slices:alice", "cms", 3)
    assert decide(job(group="students"), c).wan_action == WAN_DROP
    # a job attribute larkd forwarded takes part in the selection
    assert decide(job(ProjectName="open"), c).slice_name == ""
    # slice ids are stable across restarts and equal for the same owner, different for others
    assert decide(job(1, "alice"), c).slice_id == decide(job(2, "alice", ep="ep2"), c).slice_id
    assert decide(job(1, "alice"), c).slice_id != decide(job(2, "bob"), c).slice_id
    assert c.attributes == ["AcctGroup", "Owner", "ProjectName"]


def test_flows_per_job_are_few_and_constant():
    c = cfg()
    sliced = job_flows(job(), decide(job(), c))
    assert len(sliced) == 5
    assert len(job_flows(job(owner="mallory"), decide(job(owner="mallory"), c))) == 2
    assert len(job_flows(job(ProjectName="open"), decide(job(ProjectName="open"), c))) == 3
    # the source tag carries slice and WAN action in the metadata; the anti-spoof drop sits under it
    d = decide(job(group="cms"), c)
    tag = next(f for f in job_flows(job(group="cms"), d) if f.priority == 300 and f.table == T_SOURCE)
    assert dict(tag.match) == {"eth_src": "02:00:00:00:00:01", "eth_type": ETH_IP, "ipv4_src": "10.77.1.1"}
    assert tag.action[:3] == ("goto", T_SLICE, d.slice_id | (3 << WAN_SHIFT))
    allow = next(f for f in job_flows(job(), decide(job(), c)) if f.table == T_SLICE and f.priority == 300)
    assert dict(allow.match)["metadata"] == (decide(job(), c).slice_id, SLICE_MASK)
    # base flows do not grow with jobs: WAN policies are aggregated per action
    wan = [f for f in base_flows(c) if f.table == T_WAN and f.priority > 0]
    assert {f.action for f in wan if f.priority == 200} == {("drop",), ("output", "wan1")}
    assert len(wan) == 2 * (1 + 1 + 1 + 3)   # per action: v4 site, v6 site + link-local + multicast, 2 verdicts


def test_cookies_are_per_job_and_tagged():
    a, b = job(1), job(2)
    assert a.cookie != b.cookie and a.cookie & COOKIE_TAG_MASK == JOB_COOKIE_TAG
    again = JobReg.from_wire({**a.to_dict(), "job_id": "9.0"}, "ep1")
    assert again.cookie != a.cookie  # the slot's next job: new cookie


def test_registry_sync_replaces_an_eps_jobs_only():
    r = Registry(cfg())
    r.register(job(1))
    r.register(job(2, ep="ep2"))
    e, ch = r.register(job(1))
    assert ch.install == [] and ch.remove == []                       # unchanged: nothing to send
    e, ch = r.register(job(1, group="students"))
    assert [x.cookie for x in ch.remove] == [job(1).cookie] and ch.install  # changed decision: flows replaced
    ch = r.sync("ep1", [job(3)])
    assert [x.job.key for x in ch.remove] == ["slot1"] and [x.job.key for x in ch.install] == ["slot3"]
    assert sorted(x.job.ident for x in r.entries()) == [("ep1", "slot3"), ("ep2", "slot2")]
    assert r.unregister("ep1", "slot3") is not None and r.unregister("ep1", "slot3") is None


@pytest.mark.parametrize("field,value,words", [
    ("mac", "zz", "mac"), ("addresses", ["10.0.0.300"], "does not appear to be"), ("addresses", [], "addresses"),
    ("owner", "a b", "owner"), ("vlan", 5000, "vlan"), ("attrs", {"1bad": 1}, "attrs")])
def test_bad_registrations_name_the_job_and_field(field, value, words):
    body = {**job().to_dict(), field: value}
    with pytest.raises(LarkError) as e:
        JobReg.from_wire(body, "ep1")
    assert "job 1.0" in str(e.value) and words in str(e.value)


@pytest.mark.parametrize("extra,words", [
    ({"policy": [{"name": "x", "kind": "wan_steer", "select": "true", "port": "wan9"}]}, "alternate WAN port"),
    ({"policy": [{"name": "x", "kind": "drop", "select": "Owner =="}]}, "not a ClassAd expression"),
    ({"policy": [{"name": "x", "kind": "nope", "select": "true"}]}, "unknown kind"),
    ({"api": {"port": 70000}}, "not a port"),
    ({"switch": {"site_prefixes": ["10.0.0.0/33"], "wan_ports": ["wan0", "wan1"]}}, "site_prefixes"),
    ({"bogus": {}}, "unknown section"),
])
def test_bad_config_is_refused_clearly(extra, words):
    with pytest.raises(LarkError) as e:
        ccfg.from_mapping({**POLICIES, **extra})
    assert words in str(e.value)


def test_shipped_example_config_loads():
    c = ccfg.load("policies/sdn.toml")
    assert [p.kind for p in c.policies] == ["drop", "slice", "wan_drop", "wan_steer"]


def test_larkd_config_keys_are_checked():
    assert Config().controller_url == "" and Config().controller_failure == "closed"
    for kw, words in (({"controller_url": "http://x:1"}, "https"), ({"controller_failure": "maybe"}, "closed"),
                      ({"controller_timeout": 0}, "positive"), ({"controller_attributes": ["a b"]}, "attribute")):
        with pytest.raises(LarkError) as e:
            Config(**kw).validate()
        assert words in str(e.value)


def plan():
    """A bridged job's network as setup built it: the decided plan and its address."""
    decided = NetworkPlan(job_id="5.0", slot="slot1", key="k1", network_type="bridge", owner="alice",
                          accounting_group="cms", vlan=7, job_attrs={"ProjectName": "lhc"})
    return JobNetwork(decided, Addresses(ipv4="10.77.1.5"))


def test_registration_carries_what_the_policies_need():
    r = registration(plan(), "02:00:00:00:00:05")
    assert r == {"key": "k1", "job_id": "5.0", "owner": "alice", "accounting_group": "cms",
                 "addresses": ["10.77.1.5"], "mac": "02:00:00:00:00:05", "vlan": 7, "request_bandwidth_mbit": 0.0,
                 "attrs": {"ProjectName": "lhc"}, "tagged": False}   # a Linux-bridge job: not tagged (issue 26)
    assert JobReg.from_wire(r, "ep1").attrs == {"ProjectName": "lhc"} and not JobReg.from_wire(r, "ep1").tagged


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]   # nothing listens once the socket is closed


@pytest.fixture
def tls(tmp_path):
    from lark.controller import certs
    certs.make(str(tmp_path), ["controller=127.0.0.1", "ep1"])
    return tmp_path


def client(tls, failure):
    c = Config(controller_url=f"https://127.0.0.1:{closed_port()}", controller_ca=str(tls / "ca.pem"),
               controller_cert=str(tls / "ep1.pem"), controller_key=str(tls / "ep1.key"),
               controller_failure=failure, controller_timeout=0.5).validate()
    return ControllerClient(c, records=None)


def test_controller_down_fail_closed_refuses_the_job(tls):
    with pytest.raises(LarkError) as e:
        client(tls, "closed").register(plan(), "02:00:00:00:00:05")
    assert "job 5.0" in str(e.value) and "did not acknowledge" in str(e.value) and "controller_failure" in str(e.value)


def test_controller_down_fail_open_warns(tls, caplog):
    with caplog.at_level(logging.WARNING):
        client(tls, "open").register(plan(), "02:00:00:00:00:05")
    assert "job 5.0 starts without the pool controller's flows" in caplog.text


def test_nat_jobs_and_disabled_client_do_not_register(tls):
    bridged = plan()
    nat = JobNetwork(dataclasses.replace(bridged.plan, network_type="nat"), bridged.addrs)
    client(tls, "closed").register(nat, "")   # would raise if it tried: nothing listens
    ControllerClient(Config(), records=None).register(plan(), "02:00:00:00:00:05")


class FakeApp:
    """Stands in for the OpenFlow app: records what would go to the switches, answers as told."""
    def __init__(self, switches=1, errors=()):
        self.switches_n, self.errors, self.calls = switches, list(errors), []
        self.switches = {}
        self.last_reconcile = {}

    def apply(self, install, remove):
        self.calls.append(([e.cookie for e in install], [e.cookie for e in remove]))
        return {"switches": self.switches_n, "flows": sum(len(e.flows) for e in install), "removed": len(remove),
                "errors": self.errors}


@pytest.fixture
def service(monkeypatch):
    from lark.controller import ofapp
    from lark.controller.service import Controller

    def make(app):
        monkeypatch.setattr(ofapp, "INSTANCE", app)
        return Controller(cfg(), Registry(cfg()))
    return make


def test_registration_is_acknowledged_only_when_a_switch_has_the_flows(service):
    ok = service(FakeApp())
    code, body = ok.register(job(1))
    assert code == 200 and body["switches"] == 1 and body["flows_per_switch"] == 5
    none = service(FakeApp(switches=0))
    code, body = none.register(job(2))
    assert code == 503 and "no switch is connected" in body["error"] and "job 2.0" in body["error"]
    assert len(none.registry) == 1          # kept: a switch that connects later gets its flows
    bad = service(FakeApp(errors=["switch 1 refused flows of 3.0: OpenFlow error type 5 code 1"]))
    code, body = bad.register(job(3))
    assert code == 503 and "refused flows of 3.0" in body["error"]


def test_unregister_and_resync_remove_by_cookie_and_are_idempotent(service):
    app = FakeApp()
    c = service(app)
    c.register(job(1))
    c.register(job(2))
    assert c.unregister("ep1", "slot1") == (200, {"removed": True, "switches": 1})
    assert app.calls[-1] == ([], [job(1).cookie])
    assert c.unregister("ep1", "slot1") == (200, {"removed": False})
    n = len(app.calls)
    assert c.sync("ep1", [job(2)])[1]["installed"] == 0 and len(app.calls) == n   # nothing changed: no flow mods
    code, body = c.sync("ep1", [])
    assert body["removed"] == 1 and app.calls[-1] == ([], [job(2).cookie])
    st = c.status()
    assert st["totals"]["jobs"] == 0 and st["totals"]["base_flows"] == len(base_flows(cfg()))


def test_larkd_accepts_only_the_controllers_certificate(tls):
    import ssl as _ssl
    import threading
    from http.server import BaseHTTPRequestHandler
    from lark.controller import certs

    certs.make(str(tls), ["ep2"])   # another EP's certificate from the same CA, posing as the controller

    class Ack(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"   # keep-alive, as the controller's API
        connections = []

        def setup(self):
            super().setup()
            Ack.connections.append(self.client_address)

        def do_POST(self):
            # Answer, then drop the connection without saying so: the client's kept connection goes stale.
            self.close_connection = True
            self.rfile.read(int(self.headers["Content-Length"]))
            data = b'{"cookie": "0x4a", "flows_per_switch": 5, "switches": 1}'
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *a):
            pass

    def serve(name):
        from http.server import ThreadingHTTPServer
        srv = ThreadingHTTPServer(("127.0.0.1", 0), Ack)
        ctx = _ssl.SSLContext(_ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(str(tls / f"{name}.pem"), str(tls / f"{name}.key"))
        srv.socket = ctx.wrap_socket(srv.socket, server_side=True)
        threading.Thread(target=srv.serve_forever, daemon=True).start()
        return srv

    for name, accepted in (("controller", True), ("ep2", False)):
        srv = serve(name)
        try:
            c = Config(controller_url=f"https://127.0.0.1:{srv.server_address[1]}", controller_ca=str(tls / "ca.pem"),
                       controller_cert=str(tls / "ep1.pem"), controller_key=str(tls / "ep1.key"),
                       controller_timeout=2.0).validate()
            if accepted:
                client = ControllerClient(c, records=None)
                client.register(plan(), "02:00:00:00:00:05")
                client.register(plan(), "02:00:00:00:00:05")   # the stale connection is replaced once
                assert len(Ack.connections) == 2
            else:
                with pytest.raises(LarkError) as e:
                    ControllerClient(c, records=None).register(plan(), "02:00:00:00:00:05")
                assert "not the controller" in str(e.value) and "job 5.0" in str(e.value)
        finally:
            srv.shutdown()
