"""larkd gives freed heap pages back once per burst of setups/teardowns, when a poll finds it quiet (issue 27)."""
from __future__ import annotations

from lark.daemon.heaptrim import HeapTrim, glibc_malloc_trim


def polls(heap: HeapTrim, n: int = 1) -> int:
    """n polls as larkd's poller runs them; how many trims they made."""
    made = 0
    for _ in range(n):
        if heap.due():
            heap.run()
            made += 1
    return made


def test_one_trim_per_burst_and_only_once_it_is_over():
    trims: list[int] = []
    heap = HeapTrim(lambda: trims.append(1))
    assert polls(heap, 3) == 0                  # nothing happened yet
    for _ in range(16):
        heap.changed()
    assert polls(heap) == 0                     # the burst was still going at this poll
    assert polls(heap) == 1                     # a quiet poll: trim
    assert polls(heap, 5) == 0                  # once per burst
    heap.changed()
    assert polls(heap) == 0 and polls(heap) == 1
    assert len(trims) == 2


def test_a_burst_that_goes_on_is_not_trimmed_during_it():
    heap = HeapTrim(lambda: None)
    for _ in range(10):
        heap.changed()
        assert polls(heap) == 0


def test_without_malloc_trim_nothing_is_due():
    heap = HeapTrim(None)
    heap.trim = None
    heap.changed()
    assert polls(heap, 3) == 0


def test_glibc_trim_runs_here():
    trim = glibc_malloc_trim()
    assert trim is not None   # Debian's glibc has it
    trim()
