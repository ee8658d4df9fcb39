"""Two equal lark-controllers on one private OVS (HA, issue 26; docs/controller.md "HA model"): SdnPool with a
second controller. Used by tests/integration/test_controller_ha.py and bench/controller_ha.py."""
from __future__ import annotations

import time

from .sdn import BRIDGE, SdnPool, free_port


class HaPool(SdnPool):
    """SdnPool with a second controller (its own OpenFlow and API ports, the same config otherwise) on the same
    switch: `set-controller` names both, and the switch retries a lost one every second (max_backoff)."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.ports = [(self.of_port, self.api_port), (free_port(), free_port())]
        self.ctls: list = [None, None]

    @property
    def urls(self) -> str:
        """larkd's controller_url for both controllers."""
        return ",".join(f"https://127.0.0.1:{api}" for _, api in self.ports)

    def in_netns(self, ns: str) -> None:
        """Run the switch and both controllers in an existing netns (a fake EP's), before start()."""
        self.core, self.own_core = ns, False
        self.ovs.netns = ns

    def cfg_of(self, i: int):
        return self.cfg_path if i == 0 else self.tmp / "sdn2.toml"

    def start_controller(self, i: int = 0) -> None:
        if i == 1:
            text = self.cfg_path.read_text()
            for (of0, api0), (of1, api1) in [(self.ports[0], self.ports[1])]:
                text = text.replace(f"port = {of0}\n", f"port = {of1}\n").replace(f"port = {api0}\n",
                                                                                  f"port = {api1}\n")
            self.cfg_of(1).write_text(text)
        saved = self.cfg_path, self.log_path
        self.cfg_path, self.log_path = self.cfg_of(i), self.tmp / f"controller{i}.log"
        try:
            super().start_controller()
        finally:
            self.cfg_path, self.log_path = saved
        self.ctls[i] = self.ctl

    def start(self) -> "HaPool":
        super().start()                       # controller 0 and the switch, connected over TLS
        self.start_controller(1)
        self.ovs.vsctl("set-controller", BRIDGE, *(f"ssl:127.0.0.1:{of}" for of, _ in self.ports))
        for uuid in self.ovs.vsctl("--bare", "--columns=_uuid", "list", "controller").split():
            self.ovs.vsctl("set", "controller", uuid, "max_backoff=1000")
        for i in (0, 1):
            self.wait_ready(i)
        return self

    def api_at(self, i: int, *a, **kw):
        saved, self.api_port = self.api_port, self.ports[i][1]
        try:
            return self.api(*a, **kw)
        finally:
            self.api_port = saved

    def status(self, i: int) -> dict:
        code, st = self.api_at(i, "GET", "/v1/status", cert="controller")
        assert code == 200, st
        return st

    def wait_ready(self, i: int, timeout: float = 30) -> float:
        """Until controller i has the switch ready; returns when its API first answered (time.time())."""
        deadline, first = time.time() + timeout, None
        while time.time() < deadline:
            if self.ctls[i].poll() is not None:
                raise RuntimeError(f"controller {i} exited:\n{(self.tmp / f'controller{i}.log').read_text()[-4000:]}")
            try:
                st = self.status(i)
                first = first or time.time()
                if any(s["ready"] for s in st["switches"]):
                    return first
            except (OSError, AssertionError):
                pass
            time.sleep(0.05)
        raise RuntimeError(f"controller {i}: the switch was not ready within {timeout} s")

    def kill(self, i: int) -> None:
        self.ctls[i].kill()
        self.ctls[i].wait(10)
