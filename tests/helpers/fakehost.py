"""A fake execution point: a "host" netns with an uplink veth to a "world" netns holding test servers.

larkd runs inside the host netns with a private config (own socket, state, netns-name prefix), so nothing
touches the machine's real interfaces or firewall. Every process started here is ended by PID in close().
"""
from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from lark import config as larkconfig

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent.parent / "testbed"))
import testbed  # noqa: E402  (stdlib-only; owns the EP/world namespace layout)

WORLD_IP = testbed.WORLD_IP
HOST_IP = testbed.HOST_IP
PY = sys.executable
# The job side runs as an unprivileged user, who may not be able to read the test runner's interpreter
# (e.g. under /root). lark-job-wrapper needs only the standard library, so the system Python serves.
JOB_PY = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable


def sh(argv: list[str], check: bool = True, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(argv, capture_output=True, text=True, check=check, **kw)


def build_starter(dest_dir: str) -> str:
    out = os.path.join(dest_dir, "lark-test-starter")
    sh(["gcc", "-O2", "-Wall", "-o", out, str(HERE / "test_starter.c")])
    return out


class FakeHost:
    def __init__(self, tmp: str, starter: str, firewall: str = "nftables", ovs: bool = False, **cfg_overrides):
        self.id = secrets.token_hex(3)
        self.tmp = Path(tmp)
        self.ovs = None
        if ovs:
            from .ovs import PrivateOVS
            self.ovs = PrivateOVS(str(self.tmp / "ovs"), f"lark-test-host-{self.id}")
            cfg_overrides.update(ovs_db=f"unix:{self.ovs.sock}", ovs_rundir=str(self.ovs.dir))
        self.host_ns = f"lark-test-host-{self.id}"
        self.world_ns = f"lark-test-world-{self.id}"
        self.starter = starter
        self.procs: list[subprocess.Popen] = []
        self.larkd: subprocess.Popen | None = None
        self.www = self.tmp / "www"
        self.ads = self.tmp / "ads"
        self.cfg = larkconfig.Config(
            socket=str(self.tmp / "run" / "lark.sock"), run_dir=str(self.tmp / "run"),
            state_dir=str(self.tmp / "state"), netns_prefix=f"lark-t{self.id}-", starter_paths=[starter],
            ad_source="files", ad_dir=str(self.ads), uplink="up0", subnet="10.213.0.0/24",
            firewall=firewall, poll_interval=0.5, inbound_ports="20000-20099", **cfg_overrides).validate()
        self.cfg_path = self.tmp / "lark.toml"

    # -- namespaces ---------------------------------------------------------------------------------
    def in_host(self, argv: list[str]) -> list[str]:
        return ["nsenter", f"--net=/run/netns/{self.host_ns}", *argv]

    def in_world(self, argv: list[str]) -> list[str]:
        return ["nsenter", f"--net=/run/netns/{self.world_ns}", *argv]

    def start(self) -> "FakeHost":
        testbed.make_ep_namespaces(self.host_ns, self.world_ns)
        self.www.mkdir(parents=True, exist_ok=True)
        self.ads.mkdir(mode=0o755, parents=True, exist_ok=True)
        self.cfg_path.write_text(larkconfig.dump(self.cfg))
        world = subprocess.Popen(self.in_world([PY, str(HERE / "worldserver.py"), str(self.www)]),
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.procs.append(world)
        assert world.stdout.readline().strip() == "ready", "world servers did not start"
        if self.ovs:
            self.ovs.start()
        self.start_larkd()
        return self

    # -- larkd ----------------------------------------------------------------------------------------
    def start_larkd(self, wait: bool = True) -> subprocess.Popen:
        log = open(self.tmp / "larkd.log", "a")
        self.larkd = subprocess.Popen(self.in_host([PY, "-m", "lark.daemon.server", "--config", str(self.cfg_path),
                                                    "--log-level", "DEBUG"]), stdout=log, stderr=log)
        self.procs.append(self.larkd)
        if wait:
            self.wait_ready()
        return self.larkd

    def wait_ready(self, timeout: float = 60) -> None:   # ~1 s idle, several s on a loaded CI machine: x3 and more
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.larkd.poll() is not None:
                raise RuntimeError(f"larkd exited with {self.larkd.returncode}:\n{self.larkd_log()}")
            if self.lark("status", check=False).returncode == 0:
                return
            time.sleep(0.05)
        raise RuntimeError(f"larkd did not answer `lark status` within {timeout} s of its start:\n{self.larkd_log()}")

    def stop_larkd(self, sig: int = signal.SIGTERM) -> None:
        if self.larkd and self.larkd.poll() is None:
            self.larkd.send_signal(sig)
            self.larkd.wait(10)

    def larkd_log(self) -> str:
        p = self.tmp / "larkd.log"
        return p.read_text()[-5000:] if p.exists() else ""

    def lark(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        return sh(self.in_host([PY, "-m", "lark.cli", "--config", str(self.cfg_path), *args]), check=check)

    def status(self) -> list[dict]:
        return json.loads(self.lark("status", "--json").stdout)

    # -- jobs -----------------------------------------------------------------------------------------
    def publish_ad(self, slot: str, job_ad: str, machine_ad: str = "") -> None:
        (self.ads / f"{slot}.job.ad").write_text(job_ad)
        if machine_ad:
            (self.ads / f"{slot}.machine.ad").write_text(machine_ad)

    def job_argv(self, slot: str, workload: list[str], uid: int = 65534, host_netns: bool = False,
                 wrapper: bool = True) -> list[str]:
        argv = [self.starter, "-a", slot, "-u", str(uid)]
        if host_netns:
            argv.append("-H")
        inner = [JOB_PY, "-m", "lark.job.wrapper"] if wrapper else []
        env = ["env", f"LARK_SOCKET={self.cfg.socket}", f"PYTHONPATH={HERE.parent.parent}"]
        return self.in_host([*argv, "--", *env, *inner, JOB_PY, str(HERE / "workload.py"), *workload])

    def run_job(self, slot: str, workload: list[str], job_ad: str = "ClusterId = 1\nProcId = 0",
                timeout: float = 60, **kw) -> subprocess.CompletedProcess:
        self.publish_ad(slot, job_ad)
        return sh(self.job_argv(slot, workload, **kw), check=False, timeout=timeout)

    def spawn_job(self, slot: str, workload: list[str], job_ad: str = "ClusterId = 1\nProcId = 0",
                  **kw) -> subprocess.Popen:
        self.publish_ad(slot, job_ad)
        p = subprocess.Popen(self.job_argv(slot, workload, **kw), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True)
        self.procs.append(p)
        return p

    def end_job(self, p: subprocess.Popen, netns: str, timeout: float = 30) -> tuple[str, str]:
        """End a job that would run on (a long listen or sleep, long so that a loaded machine cannot outlast it) the
        way a job ends: its processes, the ones in its netns, are killed by PID, and its starter then exits as after
        any job. Killing only the starter would leave the job holding the test's pipes until its own end."""
        for pid in sh(["ip", "netns", "pids", netns], check=False).stdout.split():
            try:
                os.kill(int(pid), signal.SIGKILL)
            except ProcessLookupError:
                pass   # ended meanwhile
        return p.communicate(timeout=timeout)

    # -- inspection -----------------------------------------------------------------------------------
    def residue(self) -> dict:
        """What the kernel (not the records) still holds for this host's jobs."""
        netns = [n for n in os.listdir("/run/netns") if n.startswith(self.cfg.netns_prefix)]
        links = json.loads(sh(["ip", "-n", self.host_ns, "-j", "link", "show"]).stdout)
        lk = [l["ifname"] for l in links if l["ifname"].startswith("lk-")]
        nft = sh(self.in_host(["nft", "-j", "list", "ruleset"])).stdout
        objs = json.loads(nft)["nftables"] if nft.strip() else []
        per_job = sorted(o[k]["name"] for o in objs for k in ("chain", "counter") if k in o
                         and (o[k]["name"].startswith("j_") or o[k]["name"].startswith("LARK-")
                              and o[k]["name"].count("-") >= 2 and o[k]["name"].split("-")[1] not in
                              ("PRE", "FWD", "INPUT", "DNAT", "POST")))
        elems = sorted(str(e) for o in objs if "map" in o for e in o["map"].get("elem", []))
        locks = []
        ipam = Path(self.cfg.ipam_dir)
        if ipam.exists():
            locks = sorted(str(p.relative_to(ipam)) for p in ipam.rglob("*") if p.is_file()
                           and not p.name.startswith("."))
        records = sorted(os.listdir(self.cfg.records_dir)) if os.path.isdir(self.cfg.records_dir) else []
        out = {"netns": netns, "links": lk, "fw": per_job, "elements": elems, "locks": locks, "records": records}
        if self.ovs:
            ovs_ports = [p for p in self.ovs.vsctl("list-ports", self.cfg.ovs_bridge_name).split()
                         if p.startswith("lk-")] if self.ovs.vsctl("list-br").split() else []
            from lark.kernel.attach.ovs import UPLINK_GUARD_COOKIE  # the bridge's own flows, not a job's
            bridge_own = {"0x0", hex(int(UPLINK_GUARD_COOKIE, 16))}
            ovs_ports += [f"flow {line.strip()}" for line in self.ovs_flows()
                          if line.split("cookie=", 1)[1].split(",", 1)[0] not in bridge_own]
            out["ovs"] = ovs_ports
        return out

    def ovs_flows(self) -> list[str]:
        if not self.ovs or self.cfg.ovs_bridge_name not in self.ovs.vsctl("list-br").split():
            return []
        cp = sh(["ovs-ofctl", "--names", "dump-flows", f"unix:{self.ovs.dir}/{self.cfg.ovs_bridge_name}.mgmt"], check=False)
        return [line for line in cp.stdout.splitlines() if "cookie=" in line]

    def wait_clean(self, timeout: float = 30) -> dict:   # background teardowns queue behind each other under load
        deadline = time.time() + timeout
        while True:
            r = self.residue()
            if not any(r.values()) or time.time() > deadline:
                return r
            time.sleep(0.1)

    # -- cleanup ----------------------------------------------------------------------------------------
    def close(self) -> None:
        for p in reversed(self.procs):
            if p.poll() is None:
                p.kill()
                try:
                    p.wait(10)
                except subprocess.TimeoutExpired:
                    pass
        # Offline sweep with this host's own config, then drop the namespaces themselves.
        self.lark("gc", "--purge", check=False)
        # larkd's DNS forwarder daemonizes (it outlives larkd on purpose); gc --purge ends it only when no
        # record is left, so end it here by its pid file too.
        from lark.kernel.dns import Forwarder
        from lark.kernel.sections import DnsSection
        pid = Forwarder(DnsSection.from_config(self.cfg)).running_pid()
        if pid is not None:
            os.kill(pid, signal.SIGTERM)
        if self.ovs:
            self.ovs.close()
        for name in os.listdir("/run/netns"):
            if name.startswith(self.cfg.netns_prefix):
                sh(["umount", f"/run/netns/{name}"], check=False)
                try:
                    os.unlink(f"/run/netns/{name}")
                except OSError:
                    pass
        for ns in (self.host_ns, self.world_ns):
            sh(["ip", "netns", "del", ns], check=False)
        shutil.rmtree(self.tmp, ignore_errors=True)
