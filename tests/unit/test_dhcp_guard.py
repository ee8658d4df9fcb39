"""Issue 23 item 12: only larkd's DHCP messages leave a job's netns (the attacks: tests/integration/
test_dhcp_release.py). Here: every job netns gets the guard, whatever its inbound setting, and larkd's own socket
carries the mark the guard lets through."""
import dataclasses
import os
import socket

from helpers.fakekernel import fake_networker

from lark.kernel import dhcp
from lark.kernel.firewall import job_netns
from lark.plan import NetworkPlan


def test_the_guard_is_in_the_job_netns_table_with_and_without_the_inbound_filter():
    for block_inbound in (True, False):
        table = job_netns.rules(block_inbound)
        output = table.split("chain output", 1)[1].split("  }\n", 1)[0]
        assert f"udp dport 67 meta mark != {job_netns.DHCP_MARK:#x} drop" in output
        assert "udp dport 547 udp sport != 546 drop" in output
        assert ("chain input" in table) is block_inbound


def test_setup_puts_the_guard_in_every_job_netns_inbound_or_not(tmp_path, monkeypatch):
    net, _ = fake_networker(str(tmp_path), monkeypatch)
    seen: list[tuple[str, dict]] = []
    net.kernel = dataclasses.replace(net.kernel, secure_job_netns=lambda fd, job, **kw: seen.append((job, kw)))
    for key, inbound in (("slot1", True), ("slot2", False)):
        net.setup(NetworkPlan(job_id=f"{key}.0", slot=key, key=key, inbound=inbound), os.getpid(), 1, os.getpid(),
                  99)
    assert seen == [("slot1.0", {"block_inbound": False, "dhcpv6_client": False}),
                    ("slot2.0", {"block_inbound": True, "dhcpv6_client": False})]


def test_larkds_dhcp_socket_carries_the_guards_mark(monkeypatch):
    options: list[tuple[int, int, object]] = []

    class RecordingSocket:
        def __init__(self, *a):
            pass

        def setsockopt(self, level, name, value):
            options.append((level, name, value))

        def bind(self, address):
            pass

    monkeypatch.setattr(dhcp.socket, "socket", RecordingSocket)
    dhcp.Client("eth0", "02:00:00:00:00:01", "1.0")._socket()
    assert (socket.SOL_SOCKET, socket.SO_MARK, job_netns.DHCP_MARK) in options
