#!/usr/bin/env python3
"""The Lark pool testbed: a multi-machine HTCondor pool on one machine (paper section VI).

Every machine is a network namespace (lark-pool-*):
  cm     central manager: collector, negotiator, schedd (and two lark-controllers, HA, when the tree has them)
  ep1/2  execution points: condor_master + startd + their own larkd; jobs bridged onto the site network
  core   the "core switch": a private Open vSwitch (userspace datapath), bridge core0, one port per machine
  wan    behind the core switch over two links (ports wan0, wan1): HTTP (which link?, files, upload sink), iperf3
  dockerd on each EP only when a test asks (start_dockerd: tests/e2e_pool/test_pool_docker.py)

The HTCondor machines run from the one-machine testbed's chroot root (testbed/testbed.py builds it), each
through its own overlay mount, so every machine has its own /etc, /var/lib/condor, /run; /home is one shared
directory bind-mounted into all of them (like NFS homes on a real site). docs/pool.md explains the choices.
Jobs do not rely on it: they are submitted with file transfer, as on most pools, and run in their scratch directory
on the EP (job_scratch finds it for a driver that talks to a running job through files).

  pool.py up       build/install the shared root (testbed.py), then start the pool; waits for both EPs' slots
  pool.py down     everything stopped by PID, unmounted, namespaces removed. Safe to repeat
  pool.py status
Standard library only. The shared root is the testbed's: wrap every use in `flock /tmp/lark-testbed.lock`.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import secrets
import shutil
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import eventlog  # noqa: E402
import testbed as tb  # noqa: E402

log = logging.getLogger("pool")
REPO = tb.REPO
POOL = Path(os.environ.get("LARK_POOL_DIR", str(tb.CACHE / "pool")))
STATE = POOL / "state.json"
HOME = POOL / "home"
OVS_DIR = POOL / "ovs"
CERTS = POOL / "certs"
USERS = tb.USERS

PREFIX = "lark-pool-"
MACHINES = ["cm", "ep1", "ep2"]           # HTCondor machines (each an overlay root and a netns)
EPS = ["ep1", "ep2"]
NAMESPACES = [*MACHINES, "core", "wan"]
# One flat site subnet: jobs on different EPs are stations on the same L2 network, so they reach each other's
# addresses through the core switch without routing, and the switch sees every job's own MAC and address.
SITE_PREFIX = 24
GATEWAY = "10.77.0.1"                     # the WAN router (w0 in the wan netns)
ADDRESS = {"cm": "10.77.0.2", "ep1": "10.77.0.11", "ep2": "10.77.0.12"}
JOB_RANGE = {"ep1": "10.77.0.100-10.77.0.149", "ep2": "10.77.0.150-10.77.0.199"}
# Both WAN links present the same router MAC, so steering a job's WAN traffic to port wan1 needs no MAC
# rewrite; w1 answers no ARP (wan0 stays where the switch learns the router) and replies leave through w0.
WAN_MAC = "02:77:00:00:00:01"
WAN_SERVER = "203.0.113.10"               # a "remote site" address behind the router
WAN_HTTP_PORT, WAN_IPERF_PORT = 8000, 5201
WAN_LINKS = {"w0": "wan0", "w1": "wan1"}  # interface in the wan netns -> core switch port
SWITCH = "core0"
# Out-of-band control network between the core switch and the central manager (as on a real site).
MGMT_CORE, MGMT_CM = "10.78.0.1", "10.78.0.2"
OPENFLOW_PORT = 6653
SWITCH_DPID = 0x0000000000000c01          # the core switch's datapath id, bound to its certificate (issue 26)
REGISTRATION_PORT = 8443
# Two equal lark-controllers in the CM (HA, issue 26; docs/controller.md "HA model"): controller i listens on
# OPENFLOW_PORT + i and REGISTRATION_PORT + i, the switch connects to both, every larkd registers with both.
CONTROLLERS = 2
JOB_PORT = 20001                          # the probe jobs' listener (inside Lark's inbound_ports)
SLOTS_PER_EP = 4                          # static slots per EP (start(slots_per_ep=...) for more)
# Who may use which accounting group, on the access point (condor_config.d/56-lark-acct-groups.conf): alice
# submits with cms (bench/paper_wan.py) and students (testbed/pool_probe.py); bob and carol with none.
ACCT_GROUP_MAP = REPO / "policies" / "acct_groups.map"
ACCT_GROUP_MAP_PATH = "/etc/condor/lark-acct-groups-pool.map"


def ns_path(name: str) -> str:
    return f"/run/netns/{PREFIX}{name}"


def in_ns(name: str, argv: list[str]) -> list[str]:
    return ["nsenter", f"--net={ns_path(name)}", *argv]


def root_of(machine: str) -> Path:
    return POOL / machine / "root"


def in_machine(machine: str, argv: list[str], user: str | None = None) -> list[str]:
    """A command in a machine's root and netns (as `user` when given)."""
    pre = ["env", "-i", "PATH=/usr/local/bin:/usr/bin:/usr/sbin:/bin:/sbin", "LANG=C.UTF-8"]
    root = str(root_of(machine))
    if user:
        return in_ns(machine, ["chroot", f"--userspec={user}:{user}", root, *pre, f"HOME=/home/{user}",
                               f"USER={user}", *argv])
    return in_ns(machine, ["chroot", root, *pre, "HOME=/root", *argv])


run = tb.run


def load_state() -> dict:
    return tb.load_state(STATE)


def save_state(s: dict) -> None:
    tb.save_state(s, STATE)


def controller_available() -> bool:
    """The pool runs without lark-controller (plain learning switch) where the tree or its venv lacks it."""
    return (REPO / "lark/controller").is_dir() and shutil.which("lark-controller", path=_venv_bin()) is not None


def _venv_bin() -> str:
    return os.pathsep.join([str(REPO / ".venv/bin"), str(Path(sys.executable).parent), os.environ.get("PATH", "")])


# -- network ----------------------------------------------------------------------------------------------------
def _ovs_env() -> dict:
    d = str(OVS_DIR)
    return {**os.environ, "OVS_RUNDIR": d, "OVS_LOGDIR": d, "OVS_DBDIR": d, "OVS_SYSCONFDIR": d}


def vsctl(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return run(["ovs-vsctl", f"--db=unix:{OVS_DIR}/db.sock", "--timeout=10", *args], check=check, env=_ovs_env())


SWITCH_NICE = -10


def prioritize(pid: int) -> None:
    """The switch's forwarding ahead of the jobs' processes: a real core switch does not share its CPU with the
    jobs, here all machines share 2 cores. Every thread of `pid` (the ones it starts later inherit it). What it
    did and did not change is in docs/pool.md ("Why the switch runs at nice -10")."""
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            os.setpriority(os.PRIO_PROCESS, int(task.name), SWITCH_NICE)
        except (ProcessLookupError, PermissionError) as e:
            log.warning("pool: cannot raise the priority of switch thread %s: %s", task.name, e)


def start_switch(state: dict) -> None:
    """A private OVS in the core netns: its own database and rundir, never the system's."""
    shutil.rmtree(OVS_DIR, ignore_errors=True)
    OVS_DIR.mkdir(parents=True)
    env, d = _ovs_env(), OVS_DIR
    run(["ovsdb-tool", "create", str(d / "conf.db"), "/usr/share/openvswitch/vswitch.ovsschema"], env=env)
    run(["ovsdb-server", str(d / "conf.db"), f"--remote=punix:{d}/db.sock",
         "--remote=db:Open_vSwitch,Open_vSwitch,manager_options", f"--pidfile={d}/ovsdb.pid",
         f"--log-file={d}/ovsdb.log", f"--unixctl={d}/ovsdb.ctl", "--detach"], env=env)
    state["pids"]["ovsdb-server"] = int((d / "ovsdb.pid").read_text())
    save_state(state)
    vsctl("--no-wait", "init")
    # Veths hand the userspace datapath partial checksums; with its own TSO it finishes them (else TCP fails).
    vsctl("--no-wait", "set", "Open_vSwitch", ".", "other_config:userspace-tso-enable=true")
    run(in_ns("core", ["ovs-vswitchd", f"unix:{d}/db.sock", f"--pidfile={d}/vswitchd.pid",
                       f"--log-file={d}/vswitchd.log", f"--unixctl={d}/vswitchd.ctl", "--detach"]), env=env)
    state["pids"]["ovs-vswitchd"] = int((d / "vswitchd.pid").read_text())
    save_state(state)
    prioritize(state["pids"]["ovs-vswitchd"])
    # standalone: a learning switch until a controller takes over (then secure: see start_controller).
    vsctl("add-br", SWITCH, "--", "set", "bridge", SWITCH, "datapath_type=netdev", "fail_mode=standalone",
          "other_config:disable-in-band=true")


def make_network(state: dict) -> None:
    for name in NAMESPACES:
        run(["ip", "netns", "add", f"{PREFIX}{name}"])
        state["netns"].append(f"{PREFIX}{name}")
        save_state(state)
        run(["ip", "-n", f"{PREFIX}{name}", "link", "set", "lo", "up"])
    start_switch(state)
    core = f"{PREFIX}core"
    # Machine uplinks: port <machine> on the switch, eth0 in the machine.
    for m in MACHINES:
        run(["ip", "link", "add", "name", m, "netns", core, "type", "veth", "peer", "name", "eth0",
             "netns", f"{PREFIX}{m}"])
    for inner, port in WAN_LINKS.items():
        run(["ip", "link", "add", "name", port, "netns", core, "type", "veth", "peer", "name", inner,
             "netns", f"{PREFIX}wan"])
    for port in [*MACHINES, *WAN_LINKS.values()]:
        run(["ip", "-n", core, "link", "set", port, "up"])
        vsctl("add-port", SWITCH, port)
    # Out-of-band control link: switch <-> controller (never crosses the switch it programs).
    run(["ip", "link", "add", "name", "mgmt0", "netns", core, "type", "veth", "peer", "name", "mgmt0",
         "netns", f"{PREFIX}cm"])
    for ns, ip in (("core", MGMT_CORE), ("cm", MGMT_CM)):
        run(["ip", "-n", f"{PREFIX}{ns}", "addr", "add", f"{ip}/30", "dev", "mgmt0"])
        run(["ip", "-n", f"{PREFIX}{ns}", "link", "set", "mgmt0", "up"])
    cm = f"{PREFIX}cm"
    run(["ip", "-n", cm, "addr", "add", f"{ADDRESS['cm']}/{SITE_PREFIX}", "dev", "eth0"])
    run(["ip", "-n", cm, "link", "set", "eth0", "up"])
    run(["ip", "-n", cm, "route", "add", "default", "via", GATEWAY])
    for ep in EPS:
        # The EP's bridge exists before larkd starts, with the EP's address on it: larkd adopts it
        # (bridge_name) and HTCondor binds to an address that never moves.
        n = f"{PREFIX}{ep}"
        run(["ip", "-n", n, "link", "add", "lkbr0", "type", "bridge", "stp_state", "0", "forward_delay", "0"])
        run(["ip", "-n", n, "link", "set", "eth0", "master", "lkbr0", "up"])
        run(["ip", "-n", n, "addr", "add", f"{ADDRESS[ep]}/{SITE_PREFIX}", "dev", "lkbr0"])
        run(["ip", "-n", n, "link", "set", "lkbr0", "up"])
        run(["ip", "-n", n, "route", "add", "default", "via", GATEWAY])
    wan = f"{PREFIX}wan"
    for inner in WAN_LINKS:
        run(["ip", "-n", wan, "link", "set", inner, "address", WAN_MAC])
    run(["ip", "-n", wan, "addr", "add", f"{GATEWAY}/{SITE_PREFIX}", "dev", "w0"])
    run(["ip", "-n", wan, "link", "set", "w1", "arp", "off"])
    run(["ip", "-n", wan, "addr", "add", f"{WAN_SERVER}/32", "dev", "lo"])
    # Requests steered in through w1 come from addresses routed via w0: no reverse-path filtering here.
    for key in ("all", "default", "w0", "w1"):
        run(["ip", "netns", "exec", wan, "sysctl", "-q", "-w", f"net.ipv4.conf.{key}.rp_filter=0"])
    for inner in WAN_LINKS:
        run(["ip", "-n", wan, "link", "set", inner, "up"])


# -- WAN servers ------------------------------------------------------------------------------------------------
class WanHandler(BaseHTTPRequestHandler):
    """GET /link: the core-switch port the request came in on; GET /<file>: bytes; POST: counted and dropped."""
    server_version = "lark-pool-wan"

    def do_GET(self) -> None:
        if self.path == "/link":
            body = self.server.link.encode()  # type: ignore[attr-defined]
            self._answer(200, body)
            return
        f = self.server.files / self.path.lstrip("/")  # type: ignore[attr-defined]
        if "/" in self.path.lstrip("/") or not f.is_file():
            self._answer(404, b"no such file\n")
            return
        data = f.read_bytes()
        self._answer(200, data)

    def do_POST(self) -> None:
        left = int(self.headers.get("Content-Length", "0"))
        got = 0
        while left > 0:
            chunk = self.rfile.read(min(left, 1 << 20))
            if not chunk:
                break
            got += len(chunk)
            left -= len(chunk)
        self._answer(200, f"{got} {self.server.link}\n".encode())  # type: ignore[attr-defined]

    def _answer(self, code: int, body: bytes) -> None:
        self.send_response(code)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, fmt: str, *args) -> None:
        log.info("%s %s", self.server.link, fmt % args)  # type: ignore[attr-defined]


class LinkServer(ThreadingHTTPServer):
    """One listener per WAN link; the answer to GET /link names the link the request arrived on."""
    allow_reuse_address = True
    daemon_threads = True

    def __init__(self, port: int, link: str, files: Path):
        self.link, self.files = link, files
        super().__init__(("0.0.0.0", port), WanHandler)


# Requests that come in over link 1 go to their own listener (dnat: `redirect` needs an address on w1). A
# listener bound to w1 (SO_BINDTODEVICE) would have to answer out of w1 too, and the switch would then learn
# the router's MAC on wan1; these answer through the routing table, out of w0, like a router with one return path.
WAN_NFT = f"""table ip lark_pool_wan {{
  chain prerouting {{
    type nat hook prerouting priority dstnat; policy accept;
    iifname "w1" tcp dport {WAN_HTTP_PORT} dnat to {WAN_SERVER}:{WAN_HTTP_PORT + 1}
    iifname "w1" tcp dport {WAN_IPERF_PORT} dnat to {WAN_SERVER}:{WAN_IPERF_PORT + 1}
  }}
}}
"""


def wan_serve(files: Path) -> None:
    servers = [LinkServer(WAN_HTTP_PORT + i, link, files) for i, link in enumerate(WAN_LINKS.values())]
    for s in servers[1:]:
        threading.Thread(target=s.serve_forever, daemon=True).start()
    servers[0].serve_forever()


def start_wan(state: dict) -> None:
    www = POOL / "www"
    www.mkdir(exist_ok=True)
    f = www / "10M.bin"
    if not f.exists() or f.stat().st_size != 10_000_000:
        f.write_bytes(os.urandom(10_000_000))
    out = open(POOL / "wan.log", "a")
    http = subprocess.Popen(in_ns("wan", [sys.executable, str(Path(__file__).resolve()), "wan-serve", str(www)]),
                            stdout=out, stderr=out)
    state["pids"]["wan-http"] = http.pid
    run(in_ns("wan", ["nft", "-f", "-"]), input=WAN_NFT)
    if shutil.which("iperf3"):
        for i in range(len(WAN_LINKS)):
            iperf = subprocess.Popen(in_ns("wan", ["iperf3", "-s", "-p", str(WAN_IPERF_PORT + i)]), stdout=out,
                                     stderr=out)
            state["pids"][f"wan-iperf3-{i}"] = iperf.pid
    save_state(state)


# -- machines ---------------------------------------------------------------------------------------------------
def condor_config(machine: str, slots_per_ep: int = SLOTS_PER_EP, ep_extra: str = "") -> str:
    """A machine's HTCondor configuration; on an EP `slots_per_ep` static slots, then `ep_extra` (more lines)."""
    common = (
        "# Lark pool testbed (testbed/pool.py): one machine of a multi-machine pool.\n"
        f"CONDOR_HOST = {ADDRESS['cm']}\n"
        f"NETWORK_INTERFACE = {ADDRESS[machine]}\n"
        "NO_DNS = True\nDEFAULT_DOMAIN_NAME = lark.test\n"
        "# One user namespace across the pool (same /etc/passwd, shared /home): jobs run as their owner.\n"
        "UID_DOMAIN = lark.test\nFILESYSTEM_DOMAIN = lark.test\nTRUST_UID_DOMAIN = True\n"
        "TRUST_DOMAIN = lark-pool\n"
        "# Daemons authenticate to each other with IDTOKENS minted from the shared pool signing key.\n"
        "SEC_DEFAULT_AUTHENTICATION_METHODS = FS, IDTOKENS\n"
        "# The machines share one kernel: nothing to tune per machine (and three masters tuning it at once race).\n"
        "ENABLE_KERNEL_TUNING = False\n"
        "UPDATE_INTERVAL = 5\nNEGOTIATOR_INTERVAL = 2\nSCHEDD_INTERVAL = 5\n")
    if machine == "cm":
        return common + ("DAEMON_LIST = MASTER COLLECTOR NEGOTIATOR SCHEDD\n"
                         f"LARK_ACCT_GROUP_MAP = {ACCT_GROUP_MAP_PATH}\n")
    return common + (
        "DAEMON_LIST = MASTER STARTD LARKD\n"
        "# Static slots: several jobs start at once (a partitionable slot starts them about two at a time).\n"
        f"NUM_CPUS = {slots_per_ep}\nMEMORY = {1024 * slots_per_ep}\nSLOT_TYPE_1 = cpus=1\n"
        f"NUM_SLOTS_TYPE_1 = {slots_per_ep}\nSLOT_TYPE_1_PARTITIONABLE = False\n"
        "# Jobs are stations on the site network (bridge mode), so jobs on other EPs can reach them.\n"
        'NetworkType = "bridge"\n'
        f'LarkPoolEP = "{machine}"\n'
        "STARTD_ATTRS = $(STARTD_ATTRS) LarkPoolEP\n" + ep_extra)


def lark_knobs(ep: str, extra: dict[str, str] | None = None, controllers: int = CONTROLLERS) -> str:
    """larkd's configuration on an EP as HTCondor LARK_* knobs (docs/admin.md), after the testbed's own; `extra`
    (knob name without LARK_, lower case -> value) adds or overrides knobs; `controllers`: how many it lists."""
    knobs = {"ad_source": "startd", "poll_interval": "1.0", "uplink": "lkbr0", "subnet": "10.213.0.0/24",
             "bandwidth_mbit": "1000", "default_network_type": "bridge", "bridge_name": "lkbr0",
             "bridge_uplink": "eth0", "bridge_range": JOB_RANGE[ep], "job_mac_seed": ep, "bridge_gateway": GATEWAY,
             "bridge_prefix": str(SITE_PREFIX)}
    if controller_available():
        knobs.update(controller_url=",".join(f"https://{ADDRESS['cm']}:{REGISTRATION_PORT + i}"
                                             for i in range(controllers)),
                     controller_ca="/etc/lark/certs/ca.pem", controller_cert=f"/etc/lark/certs/{ep}.pem",
                     controller_key=f"/etc/lark/certs/{ep}.key", controller_failure="closed",
                     # Jobs on one EP meet only through the core switch, which applies the policies and sends
                     # their frames back (the controller's ep_ports): docs/pool.md.
                     bridge_isolate_jobs="true")
    knobs.update(extra or {})
    return "# larkd on this EP\n" + "".join(f"LARK_{k.upper()} = {v}\n" for k, v in knobs.items())


def make_machine(machine: str, pool_key: bytes, state: dict, slots_per_ep: int = SLOTS_PER_EP,
                 ep_condor: str = "", larkd_knobs: dict[str, str] | None = None) -> None:
    """An overlay of the shared root, its mounts, and this machine's HTCondor and Lark configuration."""
    base = POOL / machine
    shutil.rmtree(base, ignore_errors=True)
    for d in ("upper", "work", "root"):
        (base / d).mkdir(parents=True)
    root = root_of(machine)
    run(["mount", "-t", "overlay", "overlay", "-o",
         f"lowerdir={tb.ROOT},upperdir={base / 'upper'},workdir={base / 'work'}", str(root)])
    state["mounts"].append(str(root))
    save_state(state)
    for _, sub, args in tb.MOUNTS:
        run(["mount", *args, str(root / sub)])
        if "--rbind" in args:
            run(["mount", "--make-rslave", str(root / sub)])
    run(["mount", "--bind", str(HOME), str(root / "home")])
    # A fresh machine: nothing left from the one-machine testbed's runs in the shared root.
    for d in ("var/lib/condor/spool", "var/lib/condor/execute", "var/log/condor", "run/condor", "run/lark",
              "var/lib/lark", "run/netns"):
        shutil.rmtree(root / d, ignore_errors=True)
        (root / d).mkdir(parents=True)
    for d in ("var/lib/condor/spool", "var/lib/condor/execute", "var/log/condor", "run/condor", "run/lock/condor"):
        (root / d).mkdir(parents=True, exist_ok=True)
        run(["chroot", str(root), "chown", "condor:condor", "/" + d])
    knobs = lark_knobs(machine, larkd_knobs, state.get("controllers", CONTROLLERS)) if machine in EPS else ""
    (root / "etc/condor/config.d/95-lark-pool.conf").write_text(condor_config(machine, slots_per_ep, ep_condor) + knobs)
    if machine == "cm":
        shutil.copy(ACCT_GROUP_MAP, root / ACCT_GROUP_MAP_PATH.lstrip("/"))
    keydir = root / "etc/condor/passwords.d"
    keydir.mkdir(parents=True, exist_ok=True)
    keydir.chmod(0o700)
    key = keydir / "POOL"
    key.write_bytes(pool_key)
    key.chmod(0o600)
    shutil.rmtree(root / "etc/condor/tokens.d", ignore_errors=True)
    # All machines share the kernel's hostname: each resolves it to its own address (else every daemon spends a
    # minute retrying the lookup).
    hosts = "".join(f"{ADDRESS[m]} {m}.lark.test {m}\n" for m in MACHINES if m != machine)
    (root / "etc/hosts").write_text(f"127.0.0.1 localhost\n{ADDRESS[machine]} {os.uname().nodename} "
                                    f"{machine}.lark.test {machine}\n{hosts}")
    if machine in EPS:
        if controller_available():
            certs = root / "etc/lark/certs"
            certs.mkdir(parents=True, exist_ok=True)
            for name in ("ca.pem", f"{machine}.pem", f"{machine}.key"):
                shutil.copy(CERTS / name, certs / name)
            (certs / f"{machine}.key").chmod(0o600)


def start_master(machine: str, state: dict) -> None:
    err = open(POOL / f"{machine}.master.stderr", "a")
    master = subprocess.Popen(in_machine(machine, ["/usr/sbin/condor_master", "-f"]), stdout=subprocess.DEVNULL,
                              stderr=err)
    state["pids"][f"{machine}-master"] = master.pid
    save_state(state)


# The pool's SDN policies (lark-controller's [[policy]] format, docs/controller.md): the paper's three, selected
# by ClassAd expressions over the job ad. `make demo-pool` and tests/e2e_pool run jobs that each policy matches.
SDN_POLICIES = """
[[policy]]
name = "blocked-owners"
kind = "drop"
select = 'Owner == "carol"'

[[policy]]
name = "user-slices"
kind = "slice"
select = 'true'
slice_by = "Owner"

[[policy]]
name = "no-wan-for-students"
kind = "wan_drop"
select = 'AcctGroup =?= "students"'

[[policy]]
name = "bob-via-wan1"
kind = "wan_steer"
select = 'Owner == "bob"'
port = "wan1"
"""


def controller_config(policies: str | None = None, i: int = 0) -> str:
    """controller.toml (controller i: controller<i+1>.toml beyond the first): the pool's switch and API settings,
    then `policies` ([[policy]], [[wan_group]], [wan] sections; default SDN_POLICIES). Both controllers have the same
    file but for their ports."""
    return (f'[openflow]\nhost = "{MGMT_CM}"\nport = {OPENFLOW_PORT + i}\n'
            f'[api]\nhost = "{ADDRESS["cm"]}"\nport = {REGISTRATION_PORT + i}\n'
            'ca = "certs/ca.pem"\ncert = "certs/controller.pem"\nkey = "certs/controller.key"\n'
            '[switch]\nwan_ports = ["wan0", "wan1"]\n'
            f'site_prefixes = ["{GATEWAY.rsplit(".", 1)[0]}.0/{SITE_PREFIX}"]\n'
            # each EP's uplink is the switch port named after it (make_network)
            f'ep_ports = {{ {", ".join(f"{ep} = {json.dumps(ep)}" for ep in EPS)} }}\n'
            # what each EP may register (issue 26): jobs in its bridge_range, entering by its own switch port
            + "".join(f'[ep.{ep}]\nports = ["{ep}"]\naddresses = ["{JOB_RANGE[ep]}"]\n' for ep in EPS)
            + (SDN_POLICIES if policies is None else policies))


def controller_cli(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    exe = shutil.which("lark-controller", path=_venv_bin())
    return run(in_ns("cm", [exe, *args]), check=check)


def controller_file(i: int = 0) -> Path:
    """Controller i's config file: controller.toml, controller2.toml, ..."""
    return POOL / ("controller.toml" if i == 0 else f"controller{i + 1}.toml")


def _controller_name(i: int) -> str:
    return "controller" if i == 0 else f"controller{i + 1}"


def controllers_for(policies: str | None) -> int:
    """How many controllers the pool runs: CONTROLLERS, but one with [[wan_group]] limits (meters and queues are made
    by each controller on its own, not yet shared between two: docs/controller.md "HA model")."""
    return 1 if policies is not None and "[[wan_group]]" in policies else CONTROLLERS


def start_controller(state: dict, policies: str | None = None) -> None:
    """The lark-controllers in the CM's netns (from this tree's venv: they need os-ken), the core switch a client of
    each (HA: equal controllers, docs/controller.md).

    Certificates from `lark-controller certs`: the controllers' names their API address (larkd checks it), each
    EP's certificate name is the EP's identity at the controller; the switch's is bound to its datapath id."""
    shutil.rmtree(CERTS, ignore_errors=True)
    controller_cli("certs", "--dir", str(CERTS), f"controller={ADDRESS['cm']},{MGMT_CM}", *EPS,
                   f"switch:{SWITCH_DPID:x}")
    n = state["controllers"] = controllers_for(policies)
    procs = []
    for i in range(n):
        controller_file(i).write_text(controller_config(policies, i))
        procs.append(_spawn_controller(state, i))
    # secure: without a controller the switch keeps the flows it has and never falls back to learning.
    # OpenFlow over TLS only: the switch presents its own certificate (switch role, bound to its datapath id).
    switch_cert = CERTS / f"switch-{SWITCH_DPID:016x}"
    vsctl("set", "bridge", SWITCH, "fail_mode=secure", f"other_config:datapath-id={SWITCH_DPID:016x}",
          "--", "set-ssl", f"{switch_cert}.key", f"{switch_cert}.pem", str(CERTS / "ca.pem"),
          "--", "set-controller", SWITCH, *(f"ssl:{MGMT_CM}:{OPENFLOW_PORT + i}" for i in range(n)))
    # A controller that comes back is reconnected within a second (OVS's default backoff grows to 8 s).
    for uuid in vsctl("--bare", "--columns=_uuid", "list", "controller").stdout.split():
        vsctl("set", "controller", uuid, "max_backoff=1000")
    for i, p in enumerate(procs):
        _wait_switch_ready(p, i)


def _spawn_controller(state: dict, i: int = 0) -> subprocess.Popen:
    name = _controller_name(i)
    out = open(POOL / f"{name}.log", "a")
    exe = shutil.which("lark-controller", path=_venv_bin())
    p = subprocess.Popen(in_ns("cm", [exe, "run", "--config", str(controller_file(i))]), stdout=out, stderr=out)
    state["pids"][name] = p.pid
    save_state(state)
    return p


def controller_status(i: int = 0) -> dict | None:
    """`lark-controller status --json` of controller i, None when it does not answer."""
    cp = controller_cli("status", "--config", str(controller_file(i)), "--json", check=False)
    try:
        return json.loads(cp.stdout) if cp.returncode == 0 else None
    except ValueError:
        return None


def _wait_switch_ready(p: subprocess.Popen, i: int = 0, timeout: float = 30) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        st = controller_status(i)
        if st is not None and any(sw.get("ready") for sw in st.get("switches", [])):
            log.info("%s up, switch %s connected", _controller_name(i), SWITCH)
            return
        if p.poll() is not None:
            break
        time.sleep(0.5)
    name = _controller_name(i)
    raise RuntimeError(f"pool: {name} did not get the switch ready; see {POOL}/{name}.log")


def kill_controller(i: int = 0) -> None:
    """kill -9 controller i, as a crash would: the switch keeps the flows it has (fail_mode=secure), and the other
    controller (if any) keeps serving registrations."""
    state = load_state()
    pid = state["pids"].pop(_controller_name(i))
    os.kill(pid, signal.SIGKILL)
    tb._wait_gone(pid, 10)
    save_state(state)


def restart_controller(i: int = 0) -> None:
    """Start controller i again after kill_controller(i); the EPs resync it as soon as it answers."""
    state = load_state()
    _wait_switch_ready(_spawn_controller(state, i), i)


class KillDuringStarts(threading.Thread):
    """kill -9 of controller `victim` as soon as controller `witness` logs its `after`-th job registration since the
    thread started: in the middle of a burst of job starts (tests/e2e_pool/test_pool_controller_ha.py, make demo-pool).
    The witness's log is read as it grows (every 10 ms), since the registrations of a burst come within a second.
    `at`: when (time.time()); `registered_before`: the registrations the witness had logged by then."""

    def __init__(self, victim: int = 0, witness: int = 1, after: int = 1):
        super().__init__(name="kill-controller", daemon=True)
        self.victim, self.witness, self.after = victim, witness, after
        self.at: float | None = None
        self.registered_before = 0
        self._stop_event = threading.Event()
        self._log = POOL / f"{_controller_name(witness)}.log"
        self._offset = self._log.stat().st_size if self._log.exists() else 0

    def run(self) -> None:
        seen, pending = 0, b""
        with open(self._log, "rb") as f:
            f.seek(self._offset)
            while not self._stop_event.is_set():
                lines, _, pending = (pending + f.read()).rpartition(b"\n")   # whole lines only
                seen += lines.count(b"INFO lark.controller registered job ")
                if seen >= self.after:
                    self.at, self.registered_before = time.time(), seen   # the kill's time, not its wait
                    kill_controller(self.victim)
                    log.info("%s killed with -9 after %d registrations at %s", _controller_name(self.victim), seen,
                             _controller_name(self.witness))
                    return
                time.sleep(0.01)

    def stop(self) -> None:
        self._stop_event.set()
        self.join(10)
        if self.at is not None and _controller_name(self.victim) not in load_state()["pids"]:
            restart_controller(self.victim)


def restart_until_whole(i: int, job_ids: set[str], timeout: float = 60) -> float:
    """Start controller i again (after kill_controller(i)) and wait until it has every job in `job_ids` registered
    (the EPs resync it as soon as it answers); returns the seconds from its switch being ready to that."""
    restart_controller(i)
    t0 = time.time()
    while time.time() - t0 < timeout:
        st = controller_status(i)
        if st is not None and {j["job_id"] for j in st["jobs"]} >= job_ids:
            break
        time.sleep(0.2)
    return time.time() - t0


def reconfigure_controller(policies: str | None, controllers: int | None = None) -> None:
    """New controller configs with `policies` (None: SDN_POLICIES), then each controller stopped (SIGTERM, by PID;
    the switch keeps its flows) and started again, as docs/controller.md says for a config change. At the
    switch's reconnect each deletes its own flows and the meters the new config no longer has; running jobs get
    their new decisions at their EP's resync (larkd resyncs a restarted controller at once). `controllers`: how
    many run from now on (default: as many as before); the others stay stopped (the EPs register with those that
    answer), e.g. controllers_for(policies) for [[wan_group]] policies, CONTROLLERS to have them all back."""
    state = load_state()
    n = state.get("controllers", 1) if controllers is None else controllers
    for i in range(max(n, state.get("controllers", 1))):
        controller_file(i).write_text(controller_config(policies, i))
        pid = state["pids"].pop(_controller_name(i), None)
        if pid:
            _kill(pid, _controller_name(i))
        save_state(state)
        if i < n:
            _wait_switch_ready(_spawn_controller(state, i), i)
    state["controllers"] = n
    save_state(state)


def start(policies: str | None = None, slots_per_ep: int = SLOTS_PER_EP, ep_condor: str = "",
          larkd_knobs: dict[str, str] | None = None) -> None:
    """Start the pool. The defaults are what demo-pool and tests/e2e_pool use; a benchmark may give its own
    controller `policies` (controller_config), `slots_per_ep` static slots per EP, more HTCondor lines for the
    EPs (`ep_condor`) and larkd knobs (`larkd_knobs`, see lark_knobs)."""
    if load_state():
        down()
    if not tb.BUILD_STAMP.exists():
        raise SystemExit("pool: the shared root is not built; run `pool.py up`")
    state: dict = {"netns": [], "mounts": [], "pids": {}}
    save_state(state)
    try:
        make_network(state)
        start_wan(state)
        shutil.rmtree(HOME, ignore_errors=True)
        run(["cp", "-a", str(tb.ROOT / "home"), str(HOME)])
        if controller_available():
            start_controller(state, policies)
        pool_key = secrets.token_bytes(64)
        for m in MACHINES:
            make_machine(m, pool_key, state, slots_per_ep, ep_condor, larkd_knobs)
        for m in MACHINES:
            start_master(m, state)
        wait_ready()
    except BaseException:
        log.error("pool: start failed; tearing down (logs in %s)", POOL / "last-run")
        down()
        raise
    log.info("pool up: cm %s, %s; WAN server %s (links wan0, wan1); switch %s in %score",
             ADDRESS["cm"], ", ".join(f"{ep} {ADDRESS[ep]} jobs {JOB_RANGE[ep]}" for ep in EPS), WAN_SERVER,
             SWITCH, PREFIX)


def wait_ready(timeout: float = 120) -> None:
    """Both EPs' slots in the collector with job networking, and each EP's larkd answering."""
    deadline = time.time() + timeout
    seen = ""
    while time.time() < deadline:
        cp = run(in_machine("cm", ["condor_status", "-af", "LarkPoolEP", "HasJobNetworking"]), check=False)
        seen = cp.stdout
        eps = {line.split()[0] for line in cp.stdout.splitlines() if line.lower().endswith("true")}
        if eps >= set(EPS) and all(run(in_machine(ep, ["lark", "status"]), check=False).returncode == 0
                                   for ep in EPS):
            log.info("slots ready on %s", ", ".join(sorted(eps)))
            return
        time.sleep(1)
    raise RuntimeError(f"pool: EP slots not in the collector after {timeout:.0f} s (saw {seen!r}); "
                       f"see {POOL}/last-run/*/condor")


# -- dockerd on the EPs (opt-in: only tests/e2e_pool/test_pool_docker.py starts it) ------------------------------
# As the one-machine testbed's (testbed.start_dockerd): in the EP's netns, pivoted into the EP's root in a mount
# namespace of its own, socket and exec root in that root, no firewall rules, Lark's OCI runtime added. Its data
# root is a directory of the host's bind-mounted into the EP's root (overlay2 refuses an overlay underneath), and
# its cgroups go under a parent per EP (both EPs share the kernel).
def docker_cgroup_parent(ep: str) -> str:
    return f"lark-pool-docker-{ep}"


def dockerd_argv(ep: str) -> list[str]:
    argv = list(tb.DOCKERD)
    argv[argv.index("--data-root") + 1] = "/var/lib/lark-docker-pool"
    argv[argv.index("--cgroup-parent") + 1] = docker_cgroup_parent(ep)
    return argv


def in_own_root(machine: str, argv: list[str]) -> list[str]:
    """`argv` in the machine's netns and root, as in_machine, but in a mount namespace of its own pivoted into the
    root (dockerd cannot import images in a chroot, see testbed.in_own_root); private: nothing it mounts leaks out."""
    pre = ["env", "-i", "PATH=/usr/local/bin:/usr/bin:/usr/sbin:/bin:/sbin", "LANG=C.UTF-8", "HOME=/root"]
    script = ('root=$0; inner=$1; shift; cd "$root" && mkdir -p .oldroot && pivot_root . .oldroot && '
              'exec /bin/sh -c "$inner" sh "$@"')
    inner = 'umount -l /.oldroot && rmdir /.oldroot && cd / && exec "$@"'
    return in_ns(machine, ["unshare", "--mount", "--propagation", "private", "sh", "-c", script,
                           str(root_of(machine)), inner, *pre, *argv])


def docker(ep: str, argv: list[str], check: bool = True) -> subprocess.CompletedProcess:
    """The docker CLI in an EP's root and netns, on that EP's dockerd."""
    return run(in_machine(ep, ["docker", "--host", f"unix://{tb.DOCKER_SOCK}", *argv]), check=check)


def start_dockerd(timeout: float = 60) -> None:
    """dockerd on both EPs of the running pool. Safe to repeat."""
    state = load_state()
    if not state.get("pids"):
        raise SystemExit("pool: start the pool before dockerd")
    procs: dict[str, subprocess.Popen] = {}
    for ep in EPS:
        pid = state["pids"].get(f"{ep}-dockerd")
        if pid and Path(f"/proc/{pid}").exists() and docker(ep, ["version"], check=False).returncode == 0:
            continue
        root = root_of(ep)
        data, target = POOL / ep / "docker", root / "var/lib/lark-docker-pool"
        data.mkdir(exist_ok=True)
        target.mkdir(parents=True, exist_ok=True)
        if not os.path.ismount(target):
            run(["mount", "--bind", str(data), str(target)])
            state["mounts"].append(str(target))
        shutil.rmtree(root / "run/lark-docker", ignore_errors=True)  # no pid file or socket of the shared root's
        (root / "run/lark-docker").mkdir(parents=True)
        with open(POOL / f"{ep}.dockerd.log", "a") as err:  # the child has its own copy
            procs[ep] = subprocess.Popen(in_own_root(ep, dockerd_argv(ep)), stdout=subprocess.DEVNULL, stderr=err)
        state["pids"][f"{ep}-dockerd"] = procs[ep].pid  # nsenter, unshare, sh and env exec: dockerd's pid
        save_state(state)
    deadline = time.time() + timeout
    for ep, proc in procs.items():
        while docker(ep, ["version"], check=False).returncode != 0:
            if proc.poll() is not None or time.time() > deadline:
                raise RuntimeError(f"pool: dockerd on {ep} did not answer on {tb.DOCKER_SOCK}; see "
                                   f"{POOL / f'{ep}.dockerd.log'}")
            time.sleep(0.5)
        log.info("dockerd up on %s (pid %d)", ep, proc.pid)


def stop_dockerd() -> None:
    """Both EPs' dockerd stopped (their containers removed first), their cgroup parents removed. Safe to repeat."""
    state = load_state()
    for ep in EPS:
        pid = state.get("pids", {}).get(f"{ep}-dockerd")
        if not pid:
            continue
        try:
            alive = Path(f"/proc/{pid}/comm").read_text().strip() == "dockerd"
        except OSError:
            alive = False  # gone (its pid may be another process's by now)
        if alive:
            for c in docker(ep, ["ps", "-aq"], check=False).stdout.split():
                docker(ep, ["rm", "-f", c], check=False)
            _kill(pid, f"dockerd on {ep}", 30)
        run(["ip", "-n", f"{PREFIX}{ep}", "link", "del", "docker0"], check=False)
        state["pids"].pop(f"{ep}-dockerd")
        save_state(state)
        for cg in Path("/sys/fs/cgroup").glob(f"*/{docker_cgroup_parent(ep)}"):
            try:
                cg.rmdir()
            except OSError as e:
                log.warning("cgroup %s left: %s", cg, e)


# -- stop -------------------------------------------------------------------------------------------------------
def _kill(pid: int, name: str, grace: float = 5) -> None:
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    if not tb._wait_gone(pid, grace):
        log.warning("%s (pid %d) ignored SIGTERM; killing it and its children", name, pid)
        for p in tb._descendants(pid) + [pid]:
            try:
                os.kill(p, signal.SIGKILL)
            except ProcessLookupError:
                pass
        tb._wait_gone(pid, 5)


def down() -> None:
    stop_dockerd()
    state = load_state()
    pids: dict = state.get("pids", {})
    for m in reversed(MACHINES):
        pid = pids.get(f"{m}-master")
        if not pid:
            continue
        if Path(ns_path(m)).exists() and (root_of(m) / "usr/sbin").exists():
            run(in_machine(m, ["condor_off", "-master", "-fast"]), check=False)
        if not tb._wait_gone(pid, 20):
            _kill(pid, f"{m} condor_master", 1)
    for ep in EPS:
        if Path(ns_path(ep)).exists() and os.path.lexists(root_of(ep) / "usr/local/bin/lark"):  # a symlink into /opt
            tb.purge_lark(lambda argv, ep=ep: run(in_machine(ep, argv), check=False))
    for name in (*(_controller_name(i) for i in range(CONTROLLERS)), "wan-http", "wan-iperf3-0", "wan-iperf3-1",
                 "ovs-vswitchd", "ovsdb-server"):
        if pids.get(name):
            _kill(pids[name], name)
    # Everything mounted under the pool directory, deepest first (job netns names, proc/sys/dev, overlays).
    for line in reversed(Path("/proc/mounts").read_text().splitlines()):
        target = line.split()[1]
        if target.startswith(str(POOL) + "/"):
            run(["umount", "-l", target], check=False)
    for name in NAMESPACES:
        if Path(ns_path(name)).exists():
            run(["ip", "netns", "del", f"{PREFIX}{name}"], check=False)
    # The last run's logs and job directories stay in POOL/last-run for a look after the fact.
    last = POOL / "last-run"
    if any((POOL / m / "upper").exists() for m in MACHINES) or HOME.exists():
        shutil.rmtree(last, ignore_errors=True)
        last.mkdir(parents=True)
        for m in MACHINES:
            if (POOL / m / "upper/var/log").exists():
                shutil.move(POOL / m / "upper/var/log", last / m)
        for f in POOL.glob("*.log"):
            shutil.copy(f, last / f.name)
        if HOME.exists():
            shutil.move(HOME, last / "home")
    for m in MACHINES:
        shutil.rmtree(POOL / m, ignore_errors=True)
    shutil.rmtree(OVS_DIR, ignore_errors=True)
    STATE.unlink(missing_ok=True)
    log.info("pool down")


def status() -> None:
    state = load_state()
    print(json.dumps({"pool": str(POOL), "controller": controller_available(), **state}, indent=1))
    if not state.get("pids"):
        return
    print(run(in_machine("cm", ["condor_status"]), check=False).stdout)
    for ep in EPS:
        print(f"--- larkd on {ep}")
        print(run(in_machine(ep, ["lark", "status"]), check=False).stdout)
    print(vsctl("show", check=False).stdout)


# -- jobs -------------------------------------------------------------------------------------------------------
def submit_as(user: str, name: str, body: str, files: dict[str, str] | None = None) -> int:
    """Write `body` (and `files`) to /home/<user>/<name>/ (shared by all machines), condor_submit it on the CM."""
    d = HOME / user / name
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir(parents=True)
    (d / "job.sub").write_text(body)
    for fname, text in (files or {}).items():
        (d / fname).write_text(text)
    run(["chroot", str(root_of("cm")), "chown", "-R", f"{user}:{user}", f"/home/{user}/{name}"])
    cp = run(in_machine("cm", ["sh", "-c", 'cd "$0" && exec condor_submit -terse job.sub', f"/home/{user}/{name}"],
                        user=user), check=False)
    if cp.returncode != 0:
        raise RuntimeError(f"condor_submit as {user} in {name} failed: {cp.stderr.strip()}")
    return int(cp.stdout.split(".")[0])


def job_scratch(event_log: Path, job: str) -> Path | None:
    """The scratch directory of a running job, as this host sees it on the EP that runs it; None before the job
    starts and after it ended. `event_log`: the job's event log in its submit directory; `job`: "cluster.proc".

    Jobs run with file transfer (no shared filesystem): a driver that talks to a running job through files (the
    probes, bench/paper_wan.py) reads and writes them in the job's working directory on its EP, as the EP's admin
    could. The job's latest execute event names the EP (the startd's address) and the starter's CondorScratchDir;
    the EPs share one kernel, so a starter's dir_<pid> exists on one EP only."""
    where = eventlog.last_execute(event_log, job)
    if where is None or not where.scratch:
        return None
    eps = [ep for ep in EPS if ADDRESS[ep] == where.host] or EPS
    for ep in eps:
        path = root_of(ep) / where.scratch.lstrip("/")
        if path.is_dir():
            return path
    return None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("command", choices=["up", "down", "status", "start", "wan-serve"])
    ap.add_argument("arg", nargs="?")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="pool: %(message)s")
    if args.command == "wan-serve":  # internal: runs inside the wan netns
        wan_serve(Path(args.arg))
        return 0
    if os.geteuid() != 0:
        raise SystemExit("pool: run as root")
    if args.command == "up":
        tb.build()
        tb.install()
        start()
    else:
        {"down": down, "status": status, "start": start}[args.command]()
    return 0


if __name__ == "__main__":
    sys.exit(main())
