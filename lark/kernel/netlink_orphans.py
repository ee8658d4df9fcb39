"""Replies that pyroute2 0.9 receives for nobody, dropped from a long-lived IPRoute.

A single-object RTM_GET (link_lookup(ifname=...), get_links(index), link("get", ...)) is sent with NLM_F_ACK:
the kernel answers with the object and then an ACK. pyroute2 0.9.7 ends the request at the object and frees its
sequence number, so the ACK that follows lands in the socket's catch-all queue (tag 0), which an IPRoute not
bound to multicast groups never reads. Each one is a 36-byte message received through asyncio's recvfrom(256 KiB)
and shrunk in place, so every orphan pins a page of the malloc arena: larkd's per-worker host IPRoutes held ~8100
of them after 128 job setups, ~30 MB of RSS (bench/scale128.py). Dropping them between jobs bounds that queue.

Only the catch-all queue is emptied: a request registers its own sequence number before it sends, so its replies
never go there, and an unbound socket gets no broadcasts to lose.
"""
from __future__ import annotations

import asyncio
from typing import Any


def drop_orphan_replies(ipr: Any) -> int:
    """Empty the catch-all reply queue of a pyroute2 IPRoute (or JobNetlink) between requests; returns how many
    messages were dropped. Call it from the thread that uses `ipr`, never during a request."""
    core = getattr(ipr, "asyncore", None)
    queue: asyncio.Queue | None = getattr(getattr(core, "msg_queue", None), "root", None)
    if queue is None:
        return 0  # not a pyroute2 0.9 socket (a fake in tests, or a pyroute2 without the queue)
    dropped = 0
    while True:
        try:
            queue.get_nowait()
        except asyncio.QueueEmpty:
            return dropped
        queue.task_done()  # CoreMessageQueue.join() waits on unfinished tasks
        dropped += 1
