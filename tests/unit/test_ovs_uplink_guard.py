"""Issue 17.1, OVS mode: the uplink guard flow that keeps the site side away from the host's DNS forwarder."""
import dataclasses

from lark.config import Config
from lark.kernel.attach import ovs
from lark.kernel.sections import OvsSection


def test_ovs_uplink_guard_drops_only_what_the_site_sends_to_the_forwarder(tmp_path, monkeypatch):
    assert ovs.uplink_guard_flows("up0", "169.254.53.53") == [
        "priority=120,in_port=up0,ip,nw_dst=169.254.53.53,actions=drop"]
    assert int(ovs.UPLINK_GUARD_COOKIE, 16) != 0 and ovs.UPLINK_GUARD_COOKIE != ovs.cookie_of("uplink-guard")
    mode = ovs.OvsMode(OvsSection.from_config(Config(run_dir=str(tmp_path), bridge_range="192.0.2.10-192.0.2.20",
                                                    ovs_uplink="up0")))
    added = []
    monkeypatch.setattr(ovs.OvsMode, "ports_before", property(lambda self: {"up0", "lk-slot1"}))
    monkeypatch.setattr(mode, "ofctl", lambda *a, input=None: added.append((a, input)))
    mode._guard_uplink()
    assert added == [(("add-flows", "-"), f"cookie={ovs.UPLINK_GUARD_COOKIE},priority=120,in_port=up0,ip,"
                                          "nw_dst=169.254.53.53,actions=drop\n")]
    # An adopted bridge without the uplink as a port, or no forwarder: nothing to guard, nothing installed.
    added.clear()
    monkeypatch.setattr(ovs.OvsMode, "ports_before", property(lambda self: {"lk-slot1"}))
    mode._guard_uplink()
    mode.cfg = dataclasses.replace(mode.cfg, dns_forward=False)  # a frozen section (lark/kernel/sections.py)
    monkeypatch.setattr(ovs.OvsMode, "ports_before", property(lambda self: {"up0"}))
    mode._guard_uplink()
    assert added == []
