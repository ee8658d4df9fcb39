"""A small pool network for the controller's tests and bench: a "core" netns holding a private OVS switch (userspace
datapath) and the real `lark-controller` process, job namespaces on switch ports (as if behind EP uplinks), and a
"WAN" netns on two ports (wan0, wan1). Everything is made here, named with a random id, and removed by close()."""
from __future__ import annotations

import contextlib
import http.client
import json
import os
import secrets
import signal
import socket
import ssl
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

from lark.controller import certs
from lark.kernel import netns as nsutil

from .ovs import PrivateOVS

PY = sys.executable
BRIDGE = "core"
SITE = "10.77.0.0/16"
GW = "10.77.0.1"           # the WAN router's site-side address (on wan0)
WAN_SERVER = "203.0.113.1"  # a WAN host behind the router
ROUTER_MAC = "02:77:00:00:00:01"
CORE_DPID = 0x00000000000c0de1   # the switch's datapath id, which its certificate is bound to
SERVER_PY = ("import socket,sys\n"
             "s=socket.socket(); s.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1)\n"
             "s.bind(('0.0.0.0',int(sys.argv[1]))); s.listen(64); print('ready',flush=True)\n"
             "while True:\n c,_=s.accept(); c.sendall(b'hi'); c.close()\n")


# The paper's owner drop: mallory's jobs reach nothing and nothing reaches them.
DROP_MALLORY = """
[[policy]]
name = "blocked"
kind = "drop"
select = 'Owner == "mallory"'
"""
# The owner drop and one slice per user, nothing else: the label tests' base (IPv6, untagged jobs) add their EPs.
DROP_MALLORY_AND_SLICES = DROP_MALLORY + """
[[policy]]
name = "slices"
kind = "slice"
select = 'true'
"""
# The paper's policies without the owner drop: per-user slices, no WAN for one group, another steered to wan1
# (shared by the integration tests and bench/controller.py).
SLICE_AND_WAN_POLICIES = """
[[policy]]
name = "slices"
kind = "slice"
select = 'true'
[[policy]]
name = "students-no-wan"
kind = "wan_drop"
select = 'AcctGroup =?= "students"'
[[policy]]
name = "cms-wan1"
kind = "wan_steer"
select = 'AcctGroup =?= "cms"'
port = "wan1"
"""


def started_pool(tmp: str, policies: str, **kw):
    """A started SdnPool for a pytest fixture (`yield from`), closed even when the test or the start fails."""
    p = SdnPool(tmp, policies=policies, **kw)
    try:
        p.start()
        yield p
    finally:
        p.close()


def sh(argv: list[str], check: bool = True, **kw) -> subprocess.CompletedProcess:
    cp = subprocess.run(argv, capture_output=True, text=True, **kw)
    if check and cp.returncode:
        raise RuntimeError(f"{argv} failed ({cp.returncode}): {cp.stderr.strip()}")
    return cp


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class SdnPool:
    def __init__(self, tmp: str, policies: str = "", reconcile_grace: float = 0.0, site_prefixes=(SITE,),
                 core_ns: str | None = None, openflow_tls: bool = True, isolated_eps: tuple[str, ...] = ()):
        """core_ns: run the switch and the controller in this existing netns (e.g. a fake EP's) and make no WAN.
        isolated_eps: EPs made at start (add_ep), each a bridge with isolated job ports behind one switch port."""
        self.id = secrets.token_hex(3)
        self.tmp = Path(tmp)
        self.own_core = core_ns is None
        self.core = core_ns or f"lark-sdn-core-{self.id}"
        self.wan = f"lark-sdn-wan-{self.id}"
        self.namespaces: list[str] = []
        self.procs: list[subprocess.Popen] = []
        self.ctl: subprocess.Popen | None = None
        self.jobs: dict[str, dict] = {}
        self.ovs = PrivateOVS(str(self.tmp / "ovs"), self.core)
        self.of_port, self.api_port = free_port(), free_port()
        self.tls = self.tmp / "tls"
        self.cfg_path = self.tmp / "sdn.toml"
        self.log_path = self.tmp / "controller.log"
        self.policies = policies
        self.reconcile_grace = reconcile_grace
        self.site_prefixes = list(site_prefixes)
        self._contexts: dict = {}
        self.openflow_tls = openflow_tls
        self.ep_ports: dict[str, str] = {}   # EP -> its uplink's switch port, for EPs made by add_ep()
        self.ep_ns: dict[str, str] = {}
        self.isolated_eps = isolated_eps

    # -- topology ---------------------------------------------------------------------------------------
    def _netns(self, name: str) -> None:
        sh(["ip", "netns", "add", name])
        self.namespaces.append(name)
        sh(["ip", "-n", name, "link", "set", "lo", "up"])

    def start(self) -> "SdnPool":
        if self.own_core:
            self._netns(self.core)
        self.ovs.start()
        self.ovs.vsctl("add-br", BRIDGE, "--", "set", "bridge", BRIDGE, "datapath_type=netdev",
                       "protocols=OpenFlow13", "fail_mode=secure", f"other-config:datapath-id={CORE_DPID:016x}")
        if self.own_core:
            self._make_wan()
        for ep in self.isolated_eps:
            self.add_ep(ep)
        certs.make(str(self.tls), ["controller=127.0.0.1", "ep1", "ep2", "intruder", f"switch:{CORE_DPID:x}"])
        certs.make(str(self.tmp / "other-ca"), ["ep1"])
        self.write_config()
        self.start_controller()
        if self.openflow_tls:
            t = self.tls
            sw = certs.switch_name(CORE_DPID)
            self.ovs.vsctl("set-ssl", str(t / f"{sw}.key"), str(t / f"{sw}.pem"), str(t / "ca.pem"))
            self.ovs.vsctl("set-controller", BRIDGE, f"ssl:127.0.0.1:{self.of_port}")
        else:
            self.ovs.vsctl("set-controller", BRIDGE, f"tcp:127.0.0.1:{self.of_port}")
        self.wait_switch()
        return self

    def _make_wan(self) -> None:
        # WAN router: w0 (site address, on port wan0) and w1 (same MAC, no address, on port wan1): two links to
        # the same router, so traffic steered out wan1 reaches the same next hop.
        self._netns(self.wan)
        for dev, port in (("w0", "wan0"), ("w1", "wan1")):
            sh(["ip", "link", "add", port, "netns", self.core, "type", "veth", "peer", "name", dev, "netns", self.wan])
            sh(["ip", "-n", self.wan, "link", "set", dev, "address", ROUTER_MAC])
            sh(["ip", "-n", self.core, "link", "set", port, "up"])
            self.ovs.vsctl("add-port", BRIDGE, port)
        for k in ("all", "default", "w0", "w1"):
            sh(["ip", "netns", "exec", self.wan, "sysctl", "-qw", f"net.ipv4.conf.{k}.rp_filter=0"])
        sh(["ip", "-n", self.wan, "link", "set", "w1", "arp", "off"])
        sh(["ip", "-n", self.wan, "addr", "add", f"{GW}/16", "dev", "w0"])
        sh(["ip", "-n", self.wan, "addr", "add", f"{WAN_SERVER}/32", "dev", "lo"])
        for dev in ("w0", "w1"):
            sh(["ip", "-n", self.wan, "link", "set", dev, "up"])
        self.serve(self.wan, 7000)

    def write_config(self) -> None:
        self.cfg_path.write_text(f"""
[openflow]
host = "127.0.0.1"
port = {self.of_port}
insecure_plain_openflow = {"false" if self.openflow_tls else "true"}
[api]
host = "127.0.0.1"
port = {self.api_port}
ca = "tls/ca.pem"
cert = "tls/controller.pem"
key = "tls/controller.key"
[switch]
wan_ports = ["wan0", "wan1"]
site_prefixes = {json.dumps(self.site_prefixes)}
reconcile_grace = {self.reconcile_grace}
reconcile_interval = 3600
ep_ports = {{ {", ".join(f'{ep} = "{port}"' for ep, port in self.ep_ports.items())} }}
{self.policies}
""")

    def add_job(self, name: str, ep: str, owner: str, n: int, group: str = "", port: int = 9000,
                behind: bool = False) -> dict:
        """A job namespace on its own switch port with a site address, listening on `port`; with `behind`, an
        isolated port of the bridge of EP `ep` (add_ep) instead."""
        ns = f"lark-sdn-{self.id}-{name}"
        self._netns(ns)
        mac, ip = f"02:77:{n // 256:02x}:{n % 256:02x}:00:02", f"10.77.1.{n}"
        hport = f"j{n}-{self.id}"
        if behind:
            self._job_behind_ep(ns, ep, n, mac, ip)
        else:
            sh(["ip", "link", "add", hport, "netns", self.core, "type", "veth", "peer", "name", "eth0", "netns", ns])
        sh(["ip", "-n", ns, "link", "set", "eth0", "address", mac])
        sh(["ip", "-n", ns, "addr", "add", f"{ip}/16", "dev", "eth0"])
        sh(["ip", "-n", ns, "link", "set", "eth0", "up"])
        sh(["ip", "-n", ns, "route", "add", "default", "via", GW])
        if not behind:
            sh(["ip", "-n", self.core, "link", "set", hport, "up"])
            self.ovs.vsctl("add-port", BRIDGE, hport)
        self.serve(ns, port)
        job = {"ns": ns, "ep": ep, "reg": {"key": f"slot-{name}", "job_id": f"{n}.0", "owner": owner,
                                            "accounting_group": group, "addresses": [ip], "mac": mac}}
        self.jobs[name] = job
        return job

    def add_ep(self, ep: str) -> str:
        """An "EP": a netns with a Linux bridge whose uplink is a switch port, as on the pool testbed. Jobs added
        with `behind=ep` are ports of that bridge, isolated by larkd's own code (bridge_isolate_jobs). Returns the
        switch port, which the controller's config names in ep_ports (start() makes the `isolated_eps`)."""
        ns, port = f"lark-sdn-{self.id}-{ep}", f"{ep}-{self.id}"
        self._netns(ns)
        sh(["ip", "-n", ns, "link", "add", "br0", "type", "bridge", "stp_state", "0", "forward_delay", "0"])
        sh(["ip", "link", "add", port, "netns", self.core, "type", "veth", "peer", "name", "eth0", "netns", ns])
        sh(["ip", "-n", ns, "link", "set", "eth0", "master", "br0", "up"])
        sh(["ip", "-n", ns, "link", "set", "br0", "up"])
        sh(["ip", "-n", self.core, "link", "set", port, "up"])
        self.ovs.vsctl("add-port", BRIDGE, port)
        self.ep_ns[ep], self.ep_ports[ep] = ns, port
        return port

    def _job_behind_ep(self, ns: str, ep: str, n: int, mac: str, ip: str) -> None:
        from pyroute2 import NetNS

        from lark.kernel.attach.isolation import isolate_port
        from lark.kernel.firewall import same_ep
        hport = f"j{n}"
        sh(["ip", "link", "add", hport, "netns", self.ep_ns[ep], "type", "veth", "peer", "name", "eth0", "netns", ns])
        sh(["ip", "-n", self.ep_ns[ep], "link", "set", hport, "master", "br0", "up"])
        with NetNS(self.ep_ns[ep]) as ipr:
            isolate_port(ipr, ipr.link_lookup(ifname=hport)[0], mac, f"{n}.0", "br0")
        # and larkd's netdev rules that send its frames for the EP's other jobs up the uplink (same_ep.py)
        cmds = same_ep.job_cmds("lark", "eth0", hport, f"j{n}", mac, SimpleNamespace(ipv4=ip, ipv6=None))
        sh(["ip", "netns", "exec", self.ep_ns[ep], "nft", "-j", "-f", "-"], input=json.dumps({"nftables": cmds}))

    def serve(self, ns: str, port: int) -> None:
        p = subprocess.Popen(["ip", "netns", "exec", ns, PY, "-c", SERVER_PY, str(port)], stdout=subprocess.PIPE,
                             text=True)
        self.procs.append(p)
        assert p.stdout.readline().strip() == "ready"

    def connects(self, src: str, dst_ip: str, port: int = 9000, timeout: float = 1.5) -> bool:
        """A TCP connection from job `src` to an address, answered by the server there."""
        code = ("import socket,sys\ntry:\n s=socket.create_connection((sys.argv[1],int(sys.argv[2])),"
                "timeout=float(sys.argv[3])); print(s.recv(2).decode())\nexcept OSError as e: print('fail',e)")
        cp = sh(["ip", "netns", "exec", self.jobs[src]["ns"], PY, "-c", code, dst_ip, str(port), str(timeout)])
        return cp.stdout.strip() == "hi"

    def ip(self, name: str) -> str:
        return self.jobs[name]["reg"]["addresses"][0]

    def wan_rx(self, dev: str) -> int:
        cp = sh(["ip", "-n", self.wan, "-j", "-s", "link", "show", dev])
        return json.loads(cp.stdout)[0]["stats64"]["rx"]["packets"]

    # -- controller -----------------------------------------------------------------------------------
    def start_controller(self) -> None:
        log = open(self.log_path, "a")
        self.ctl = subprocess.Popen(["ip", "netns", "exec", self.core, PY, "-m", "lark.controller.cli", "run",
                                     "--config", str(self.cfg_path), "--log-level", "DEBUG"],
                                    stdout=log, stderr=log)
        self.procs.append(self.ctl)

    def kill_controller(self) -> None:
        self.ctl.send_signal(signal.SIGKILL)
        self.ctl.wait(10)

    def log(self) -> str:
        return self.log_path.read_text()[-6000:] if self.log_path.exists() else ""

    def wait_switch(self, timeout: float = 30) -> dict:
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.ctl.poll() is not None:
                raise RuntimeError(f"controller exited {self.ctl.returncode}:\n{self.log()}")
            try:
                code, st = self.api("GET", "/v1/status", cert="controller")
                if code == 200 and any(s["ready"] for s in st["switches"]):
                    return st
            except OSError:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"switch did not connect:\n{self.log()}")

    def ssl_context(self, cert: str | None, ca_dir: Path | None = None) -> ssl.SSLContext:
        key = (cert, str(ca_dir))
        if key not in self._contexts:  # like larkd: one context per client, a new TLS connection per request
            ctx = ssl.create_default_context(cafile=str(self.tls / "ca.pem"))
            if cert:
                d = ca_dir or self.tls
                ctx.load_cert_chain(str(d / f"{cert}.pem"), str(d / f"{cert}.key"))
            self._contexts[key] = ctx
        return self._contexts[key]

    def api(self, method: str, path: str, body: object = None, cert: str | None = "ep1",
            ca_dir: Path | None = None, timeout: float = 10) -> tuple[int, dict]:
        """A request from inside the core netns (where the controller listens on loopback)."""
        fd = os.open(f"/run/netns/{self.core}", os.O_RDONLY)
        try:
            with nsutil.entered(fd):
                conn = http.client.HTTPSConnection("127.0.0.1", self.api_port, timeout=timeout,
                                                   context=self.ssl_context(cert, ca_dir))
                conn.connect()
        finally:
            os.close(fd)
        try:
            conn.request(method, path, body=json.dumps(body).encode() if body is not None else None)
            r = conn.getresponse()
            return r.status, json.loads(r.read() or b"{}")
        finally:
            conn.close()

    def register(self, name: str, **extra) -> tuple[int, dict]:
        j = self.jobs[name]
        return self.api("POST", "/v1/jobs", {**j["reg"], **extra}, cert=j["ep"])

    def unregister(self, name: str) -> tuple[int, dict]:
        j = self.jobs[name]
        return self.api("DELETE", f"/v1/jobs/{j['reg']['key']}", cert=j["ep"])

    def sync(self, ep: str, names: list[str]) -> tuple[int, dict]:
        return self.api("PUT", "/v1/sync", {"jobs": [self.jobs[n]["reg"] for n in names]}, cert=ep)

    def flows(self) -> list[str]:
        cp = sh(["ovs-ofctl", "-O", "OpenFlow13", "dump-flows", f"unix:{self.ovs.dir}/{BRIDGE}.mgmt"])
        return [line.strip() for line in cp.stdout.splitlines() if "cookie=" in line]

    def flows_with_cookie(self, cookie: str) -> list[str]:
        return [f for f in self.flows() if f"cookie={cookie}," in f]

    def close(self) -> None:
        for p in reversed(self.procs):
            if p.poll() is None:
                p.kill()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    p.wait(10)
        self.ovs.close()
        for ns in reversed(self.namespaces):
            sh(["ip", "netns", "del", ns], check=False)
