"""libnftables from several setup threads at once (real kernel, namespaces made here). Contexts made and freed in
a job's netns while another thread resolves a device name through the shared context corrupted libnftables'
global interface list: "Interface does not exist" for a bridged job's `fwd` (17 jobs starting at once), or a
heap corruption that aborts the whole process ("double free or corruption", reproduced by this test before the
process-wide library lock). The work runs in a child process so that such a crash fails the test."""
import json
import os
import secrets
import subprocess
import sys

import pytest

from helpers.fakehost import HERE

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root for namespaces")


@pytest.fixture
def two_netns():
    tag = secrets.token_hex(3)
    x, y = f"lark-nftt-x-{tag}", f"lark-nftt-y-{tag}"
    try:
        for n in (x, y):
            subprocess.run(["ip", "netns", "add", n], check=True)
        subprocess.run(["ip", "-n", x, "link", "add", "lkt0", "type", "veth", "peer", "name", "lkt1"], check=True)
        yield x, y
    finally:
        for n in (x, y):
            subprocess.run(["ip", "netns", "del", n], check=False, capture_output=True)


def test_contexts_in_other_namespaces_do_not_break_the_shared_one(two_netns):
    x, y = two_netns
    cp = subprocess.run([sys.executable, str(HERE / "nft_threads.py"), x, y, "3"], capture_output=True, text=True,
                        timeout=60)
    assert cp.returncode == 0, f"the process died ({cp.returncode}): {cp.stderr[-500:]}"
    failed, messages = cp.stdout.splitlines()[:2]
    assert int(failed) == 0, json.loads(messages)
