"""Issue 15 part B: a bridged job's first frame is not dropped by a bridge port the kernel has not enabled yet."""
import logging
import os
import secrets
import subprocess

import pytest

from lark.kernel import netns
from lark.kernel.links import BR_STATE_FORWARDING, wait_bridge_port_forwarding


@pytest.fixture
def ns():
    name = f"lark-test-brport-{secrets.token_hex(3)}"
    subprocess.run(["ip", "netns", "add", name], check=True)
    fd = os.open(f"/run/netns/{name}", os.O_RDONLY)
    try:
        with netns.netlink_in(fd) as ipr:
            yield ipr
    finally:
        os.close(fd)
        subprocess.run(["ip", "netns", "del", name], check=False)


def port_state(ipr, idx):
    return ipr.get_links(idx)[0].get_nested("IFLA_LINKINFO", "IFLA_INFO_SLAVE_DATA", "IFLA_BRPORT_STATE")


def test_port_is_disabled_until_the_jobs_end_is_up_then_waited_for(ns, caplog):
    ipr = ns
    ipr.link("add", ifname="br0", kind="bridge", br_stp_state=0, br_forward_delay=0)
    br = ipr.link_lookup(ifname="br0")[0]
    ipr.link("set", index=br, state="up")
    ipr.link("add", ifname="lk-x", kind="veth", peer={"ifname": "job0"})
    host = ipr.link_lookup(ifname="lk-x")[0]
    ipr.link("set", index=host, master=br, state="up")
    # As in setup: the host end is on the bridge and up, the job's end is still down: no carrier, port disabled.
    assert port_state(ipr, host) != BR_STATE_FORWARDING
    with caplog.at_level(logging.WARNING, logger="lark.kernel.links"):
        waited = wait_bridge_port_forwarding(ipr, host, "7.0", timeout=0.05)
    assert waited >= 0.05 and "not forwarding" in caplog.text and "7.0" in caplog.text
    ipr.link("set", index=ipr.link_lookup(ifname="job0")[0], state="up")
    caplog.clear()
    # It returns because the port forwards, not because it gave up: no warning, and less than the timeout waited
    # (generous: the kernel's link watch runs later on a loaded machine; on an idle one this takes ~1 ms).
    with caplog.at_level(logging.WARNING, logger="lark.kernel.links"):
        waited = wait_bridge_port_forwarding(ipr, host, "7.0", timeout=30)
    assert port_state(ipr, host) == BR_STATE_FORWARDING and waited < 30 and "not forwarding" not in caplog.text


def test_not_a_bridge_port_returns_at_once(ns, caplog):
    """Nothing to wait for: it returns on its first look instead of waiting out its timeout (no timed bound: the
    timeout is far beyond any scheduling delay, and a wait that ran out would warn)."""
    ns.link("add", ifname="lk-y", kind="veth", peer={"ifname": "job1"})
    with caplog.at_level(logging.WARNING, logger="lark.kernel.links"):
        waited = wait_bridge_port_forwarding(ns, ns.link_lookup(ifname="lk-y")[0], "8.0", timeout=60)
    assert waited < 60 and "not forwarding" not in caplog.text
