import pytest

from lark.errors import LarkError
from lark.kernel.linkspeed import link_speed_mbit


@pytest.mark.parametrize("content,expected", [("10000\n", 10000), ("-1\n", None), ("0\n", None), ("", None)])
def test_speed_from_sysfs(tmp_path, content, expected):
    (tmp_path / "eth0").mkdir()
    (tmp_path / "eth0" / "speed").write_text(content)
    assert link_speed_mbit("eth0", str(tmp_path)) == expected


def test_unreadable_speed_and_missing_interfaces(tmp_path):
    (tmp_path / "veth0").mkdir()  # no speed file readable: what EINVAL from a virtual driver amounts to
    assert link_speed_mbit("veth0", str(tmp_path)) is None
    for name in ("eth9", "..", "veth0/../veth0"):
        with pytest.raises(LarkError, match=f"uplink {name}: no such interface"):
            link_speed_mbit(name, str(tmp_path))


def test_real_sysfs_loopback_has_no_speed():
    assert link_speed_mbit("lo") is None
