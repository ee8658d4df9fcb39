"""lark.kernel.netlink_orphans: the ACKs pyroute2 0.9 leaves in a long-lived IPRoute's catch-all queue are dropped.

Each orphan pins a page of a malloc arena in larkd (bench/scale128.py: ~30 MB after 128 job setups through the
per-worker host IPRoutes), so the queue must end empty, and the IPRoute must keep answering afterwards.
"""
from __future__ import annotations

from pyroute2 import IPRoute

from lark.kernel.netlink_orphans import drop_orphan_replies

LOOKUPS = 20


def catch_all_size(ipr: IPRoute) -> int:
    return ipr.asyncore.msg_queue.root.qsize()


def test_single_object_gets_leave_acks_and_they_are_dropped() -> None:
    with IPRoute() as ipr:
        for _ in range(LOOKUPS):
            assert ipr.link_lookup(ifname="lo") == [1]
            ipr.get_links(1)
        leaked = catch_all_size(ipr)
        assert drop_orphan_replies(ipr) == leaked
        assert catch_all_size(ipr) == 0
        assert drop_orphan_replies(ipr) == 0
        # The socket still answers, and its queues still balance (join() returns only when every get is done).
        assert ipr.get_links(1)[0].get_attr("IFLA_IFNAME") == "lo"
        drop_orphan_replies(ipr)
        ipr.asyncore.event_loop.run_until_complete(ipr.asyncore.msg_queue.join())


def test_pyroute2_still_leaks_the_ack() -> None:
    """When this fails, pyroute2 consumes the ACK itself and drop_orphan_replies can go (see its module)."""
    with IPRoute() as ipr:
        for _ in range(LOOKUPS):
            ipr.link_lookup(ifname="lo")
        assert catch_all_size(ipr) == LOOKUPS


def test_not_a_pyroute2_socket() -> None:
    assert drop_orphan_replies(object()) == 0
