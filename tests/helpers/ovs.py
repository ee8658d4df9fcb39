"""A private Open vSwitch for tests: its own ovsdb-server and ovs-vswitchd (userspace datapath), run inside a
fake host's netns, with every file under one directory (OVS_RUNDIR & co.), so a system OVS is never touched.
Both daemons are ended by PID on close."""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

SCHEMA = "/usr/share/openvswitch/vswitch.ovsschema"


class PrivateOVS:
    def __init__(self, rundir: str, netns: str):
        self.dir = Path(rundir)
        self.netns = netns
        self.db = self.dir / "conf.db"
        self.sock = self.dir / "db.sock"
        self.pids: list[int] = []

    @property
    def env(self) -> dict:
        d = str(self.dir)
        return {**os.environ, "OVS_RUNDIR": d, "OVS_LOGDIR": d, "OVS_DBDIR": d, "OVS_SYSCONFDIR": d}

    def _ns(self, argv: list[str]) -> list[str]:
        return ["nsenter", f"--net=/run/netns/{self.netns}", *argv]

    def vsctl(self, *args: str) -> str:
        cp = subprocess.run(["ovs-vsctl", f"--db=unix:{self.sock}", "--timeout=10", *args], capture_output=True,
                            text=True, env=self.env, check=True)
        return cp.stdout

    def start(self) -> "PrivateOVS":
        shutil.rmtree(self.dir, ignore_errors=True)  # a run that died left its database and sockets
        self.dir.mkdir(parents=True)
        subprocess.run(["ovsdb-tool", "create", str(self.db), SCHEMA], check=True, env=self.env)
        d = self.dir
        subprocess.run(["ovsdb-server", str(self.db), f"--remote=punix:{self.sock}",
                        "--remote=db:Open_vSwitch,Open_vSwitch,manager_options", f"--pidfile={d}/ovsdb.pid",
                        f"--log-file={d}/ovsdb.log", f"--unixctl={d}/ovsdb.ctl", "--detach"],
                       check=True, env=self.env)
        self.pids.append(int((d / "ovsdb.pid").read_text()))
        self.vsctl("--no-wait", "init")
        # The userspace datapath forwards veth packets with partial checksums unless it does TSO itself.
        self.vsctl("--no-wait", "set", "Open_vSwitch", ".", "other_config:userspace-tso-enable=true")
        subprocess.run(self._ns(["ovs-vswitchd", f"unix:{self.sock}", f"--pidfile={d}/vswitchd.pid",
                                 f"--log-file={d}/vswitchd.log", f"--unixctl={d}/vswitchd.ctl", "--detach"]),
                       check=True, env=self.env)
        self.pids.append(int((d / "vswitchd.pid").read_text()))
        return self

    def close(self) -> None:
        for pid in reversed(self.pids):
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                continue
            deadline = time.time() + 5
            while time.time() < deadline:
                try:
                    os.kill(pid, 0)
                except ProcessLookupError:
                    break
                time.sleep(0.05)
            else:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        self.pids.clear()
        shutil.rmtree(self.dir, ignore_errors=True)
