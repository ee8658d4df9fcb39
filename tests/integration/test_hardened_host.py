"""Hardened worker nodes (issue 23 item 5): OSG and EGI advise `user.max_net_namespaces = 0`. On this kernel that
limit stops root as well (ucounts are charged to every user of the namespace), so HTCondor's starter could not make
any job's network namespace. Shown in a user namespace of the test's own, whose limit the test may set without
touching the host's: the kernel refuses unshare(CLONE_NEWNET), and Lark's doctor and pre-flight check say why."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root for a user namespace of its own")

PROBE = ("from lark import hostcheck; from lark.kernel.netns import net_namespaces_forbidden; "
         "f = hostcheck.net_namespaces(); print('doctor', f.ok, f.found); "
         "print('check', net_namespaces_forbidden() is not None)")


def in_own_userns(limit: int) -> subprocess.CompletedProcess:
    script = (f"echo {limit} > /proc/sys/user/max_net_namespaces && \"$0\" -c \"$1\" && "
              "unshare -n true; echo unshare=$?")
    return subprocess.run(["unshare", "-U", "-r", "sh", "-c", script, sys.executable, PROBE], capture_output=True,
                          text=True, timeout=60, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})


def test_a_zero_net_namespace_limit_stops_root_and_lark_names_it():
    cp = in_own_userns(0)
    assert "unshare=1" in cp.stdout and "No space left on device" in cp.stderr, (cp.stdout, cp.stderr)
    assert "doctor False user.max_net_namespaces = 0" in cp.stdout and "check True" in cp.stdout, cp.stdout


def test_a_nonzero_limit_lets_root_make_one_and_lark_is_content():
    cp = in_own_userns(5)
    assert "unshare=0" in cp.stdout, (cp.stdout, cp.stderr)
    assert "doctor True user.max_net_namespaces = 5" in cp.stdout and "check False" in cp.stdout, cp.stdout
