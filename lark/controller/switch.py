"""A switch connected to the controller, as the OpenFlow app (lark.controller.ofapp) and the WAN limit mechanisms
(lark.controller.wan_of, lark.controller.wan_queue) all see it, and the error any of them raises when it does not
answer in time or refuses a message."""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any


class SwitchError(Exception):
    """A switch did not acknowledge in time or refused a flow."""


@dataclass
class Switch:
    dp: Any                 # os_ken's Datapath: the library has no type annotations to check it against
    connected: float = field(default_factory=time.time)
    ready: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)   # one batch at a time per switch
    # group commit (ofapp LarkSwitchApp._acknowledged): the barrier in flight, and the group waiting to send the next
    inflight: Any = None
    pending: Any = None

    @property
    def ports(self) -> dict[str, int]:
        return {p.name.decode() if isinstance(p.name, bytes) else p.name: no for no, p in self.dp.ports.items()}
