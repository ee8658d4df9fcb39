import subprocess
import sys

import pytest

from lark.errors import LarkError
from lark.kernel import linkspeed


class FakeEthtool:
    speed = None

    def get_link_mode(self, ifname):
        from pyroute2.ethtool.ethtool import EthtoolLinkMode
        return EthtoolLinkMode(speed=self.speed, duplex="Full", autoneg=True, supported_ports=[],
                               supported_modes=[])

    def close(self):
        pass


@pytest.mark.parametrize("speed,expected", [(10000, 10000), (None, None), (0, None), (0xFFFFFFFF, None)])
def test_speed_as_the_driver_reports_it(monkeypatch, speed, expected):
    monkeypatch.setattr("pyroute2.ethtool.Ethtool", type("E", (FakeEthtool,), {"speed": speed}))
    assert linkspeed.link_speed_mbit("eth0") == expected
    if expected:
        assert linkspeed.detect("eth0", 1000) == expected


def test_no_speed_falls_back_to_the_configured_figure_or_says_which_knob(monkeypatch):
    monkeypatch.setattr("pyroute2.ethtool.Ethtool", FakeEthtool)
    assert linkspeed.detect("eth0", 1000) == 1000
    with pytest.raises(LarkError, match="uplink eth0: the driver reports no link speed.*LARK_BANDWIDTH_MBIT"):
        linkspeed.detect("eth0", 0)


def test_real_kernel_loopback_has_no_speed_and_a_missing_interface_is_named():
    assert linkspeed.link_speed_mbit("lo") is None
    with pytest.raises(LarkError, match="uplink nosuch9: no such interface"):
        linkspeed.link_speed_mbit("nosuch9")


def test_the_callers_network_namespace_is_asked(tmp_path):
    # In a fresh netns only lo exists: the machine's own interfaces must not be found there.
    cp = subprocess.run(["unshare", "--net", sys.executable, "-c",
                         "from lark.kernel.linkspeed import link_speed_mbit as s; s('lo'); s('eth0')"],
                        capture_output=True, text=True, timeout=60)
    if cp.returncode != 0 and "unshare failed" in cp.stderr:
        pytest.skip("cannot unshare a network namespace here")
    assert "uplink eth0: no such interface" in cp.stderr
