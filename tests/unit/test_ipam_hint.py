"""The address pools' hint (where the next search starts) is written in place on a kept descriptor
(lark/kernel/ipam.py `_remember`), not renamed per reservation: it must still read back right, across pool objects
(a restarted larkd) and when a shorter hint follows a longer one."""
import os

from lark.kernel.ipam import address_pool, port_pool


def test_a_restarted_larkd_continues_after_the_last_reservation(tmp_path):
    pool = address_pool(str(tmp_path), "10.9.0.0/24")
    got = [pool.reserve(f"k{i}") for i in range(3)]
    for i in range(3):
        pool.release(f"k{i}")
    again = address_pool(str(tmp_path), "10.9.0.0/24")  # a new process: only the file carries the hint
    assert again._hint() == pool._hint()
    assert again.reserve("k9") not in got  # not the just-freed addresses


def test_a_shorter_hint_over_a_longer_one_reads_back_as_itself(tmp_path):
    pool = port_pool(str(tmp_path), 20000, 21100)
    for i in range(1005):  # the hint reaches 4 digits
        pool.reserve(f"k{i}")
    assert pool._hint() == 1004
    pool.release("k3")
    for i in range(1005, 1101):
        pool.reserve(f"k{i}")  # fills the pool to its end ...
    assert pool.reserve("k-wrap") == "20003"  # ... and wraps to the one free port: hint 3 over "1100"
    assert pool._hint() == 3
    assert os.stat(pool._path(".last")).st_mode & 0o777 == 0o600
