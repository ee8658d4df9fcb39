"""docs/install.md is a tested path: the commands in its marked block, run as written (as root, in a checkout)
inside a clean Debian root with HTCondor, install Lark and end with a passing `lark doctor`.

The clean root is an overlay on the testbed's cached Debian sid root (condor + minicondor and their Python
bindings) with every trace of an earlier Lark install hidden, so the cached root itself is never changed. The
root has no name service: pip gets its wheels (pyroute2, setuptools) from a local directory through pip's own
environment settings, which leaves the documented commands untouched.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from condor import REPO, testbed

DOC = REPO / "docs" / "install.md"
BLOCK = re.compile(r"<!-- install-commands: begin[^>]*-->\s*```sh\n(.*?)```\s*<!-- install-commands: end -->", re.S)
FORMER_INSTALLS = ["opt/lark", "opt/lark-src", "etc/lark", "etc/condor/config.d/50-lark.conf",
                   "etc/condor/config.d/90-lark-testbed.conf", "etc/systemd/system/larkd.service",
                   *(f"usr/local/bin/{n}" for n in ("larkd", "lark", "lark-job-wrapper", "lark-starter",
                                                     "lark-hook", "lark-prepare-job", "lark-controller"))]


def install_commands() -> list[str]:
    m = BLOCK.search(DOC.read_text())
    assert m, f"{DOC} has no install-commands block"
    return [line for line in m.group(1).splitlines() if line.strip() and not line.lstrip().startswith("#")]


def test_the_doc_block_is_what_an_admin_reads():
    cmds = install_commands()
    assert any("pip install dist/htcondor_lark-" in c for c in cmds)
    assert cmds[-1] == "/opt/lark/bin/lark doctor"
    assert not any(re.search(r"pip install (-\S+ )*lark\b", c) for c in cmds)  # the unrelated package


def _sh(argv: list[str], **kw) -> subprocess.CompletedProcess:
    return subprocess.run(argv, capture_output=True, text=True, timeout=600, **kw)


@pytest.fixture
def clean_root(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("needs root (overlay mount, chroot)")
    testbed.build()
    upper, work, merged = tmp_path / "upper", tmp_path / "work", tmp_path / "root"
    for d in (upper, work, merged):
        d.mkdir()
    mounts: list[Path] = []
    try:
        cp = _sh(["mount", "-t", "overlay", "overlay", "-o",
                  f"lowerdir={testbed.ROOT},upperdir={upper},workdir={work}", str(merged)])
        assert cp.returncode == 0, cp.stderr
        mounts.append(merged)
        for rel in FORMER_INSTALLS:  # deleting in the overlay only hides them (whiteouts in upper)
            p = merged / rel
            if p.is_symlink() or p.is_file():
                p.unlink()
            elif p.is_dir():
                shutil.rmtree(p)
        for name, args in (("proc", ["-t", "proc", "proc"]), ("dev", ["--rbind", "/dev"])):
            assert _sh(["mount", *args, str(merged / name)]).returncode == 0
            mounts.append(merged / name)
        yield merged
    finally:
        for m in reversed(mounts):
            _sh(["umount", "-R", "-l", str(m)])


def test_install_doc_commands_install_lark_into_a_clean_root(clean_root, tmp_path):
    root = clean_root
    wheels = root / "opt" / "install-test-wheels"
    # What the wheel will ask for: its run-time requirements as the checkout declares them (HTCondor's own
    # bindings come from the root's packages, never from the index).
    needs = testbed.runtime_requirements()
    cp = _sh([sys.executable, "-m", "pip", "download", "-q", "--only-binary=:all:", "-d", str(wheels),
              "setuptools", "wheel", *needs])
    assert cp.returncode == 0, cp.stderr
    checkout = root / "root" / "lark-checkout"
    shutil.copytree(REPO, checkout, ignore=shutil.ignore_patterns(".git", ".venv", "__pycache__", "*.egg-info",
                                                                   ".hypothesis", "build", "dist"))
    env = ["env", "-i", "PATH=/usr/local/bin:/usr/bin:/usr/sbin:/bin:/sbin", "HOME=/root", "LANG=C.UTF-8",
           "PIP_NO_INDEX=1", "PIP_FIND_LINKS=/opt/install-test-wheels", "PIP_DISABLE_PIP_VERSION_CHECK=1"]
    for cmd in install_commands():
        cp = _sh(["chroot", str(root), *env, "sh", "-ec", f"cd /root/lark-checkout && {cmd}"])
        assert cp.returncode == 0, f"`{cmd}` failed ({cp.returncode}):\n{cp.stdout[-3000:]}\n{cp.stderr[-3000:]}"
    doctor = cp.stdout
    assert re.search(r"^netns\s+ok\s+required", doctor, re.M) and re.search(r"^veth\s+ok\s+required", doctor, re.M)
    assert re.search(r"^JOB_EXIT\s+ok", doctor, re.M), doctor

    # The distribution is htcondor-lark, in its own venv, importing the bindings of the installed HTCondor.
    cp = _sh(["chroot", str(root), "/opt/lark/bin/python", "-c",
              "import importlib.metadata as m, lark, htcondor2; print(m.version('htcondor-lark'), lark.__file__)"])
    assert cp.returncode == 0, cp.stderr
    assert cp.stdout.split()[1].startswith("/opt/lark/lib/")
    # Every absolute path the config fragment and the systemd unit name exists in the installed root.
    frag = (root / "etc/condor/config.d/50-lark.conf").read_text()
    bin_dir = re.search(r"^LARK_BIN = (\S+)$", frag, re.M).group(1)
    named = set(re.findall(r"\$\(LARK_BIN\)/([\w-]+)", frag))
    assert named >= {"lark-starter", "lark-job-wrapper", "lark-prepare-job", "larkd", "lark"}
    # No JOB_EXIT hook: on HTCondor 24.x/25.x it makes the starter exit during output transfer.
    assert not re.search(r"^\w+_HOOK_JOB_EXIT\s*=", frag, re.M)
    for name in named:
        assert os.access(root / bin_dir.lstrip("/") / name, os.X_OK), f"{bin_dir}/{name} is not installed"
    # The transfer plugins it names are lark install-hook's symlinks to lark-transfer-plugin (issue 22).
    libexec = re.search(r"^LARK_LIBEXEC = (\S+)$", frag, re.M).group(1)
    plugins = re.findall(r"\$\(LARK_LIBEXEC\)/transfer/([\w-]+)", frag)
    assert plugins == ["curl_plugin"], plugins
    link = root / libexec.lstrip("/") / "transfer" / "curl_plugin"
    assert os.readlink(link) == f"{bin_dir}/lark-transfer-plugin", link
    assert os.access(root / bin_dir.lstrip("/") / "lark-transfer-plugin", os.X_OK)
    unit = (root / "etc/systemd/system/larkd.service").read_text()
    exe = re.search(r"^ExecStart=(\S+)", unit, re.M).group(1)
    assert os.access(root / exe.lstrip("/"), os.X_OK), exe
    # condor_config_val in the root reads the fragment: HTCondor sees Lark's starter at that path, the compiled one
    # lark install-hook built (the root has gcc), which falls back to the Python one.
    cp = _sh(["chroot", str(root), "condor_config_val", "STARTER"])
    assert cp.stdout.strip() == f"{libexec}/lark-starter", cp.stderr
    assert (root / libexec.lstrip("/") / "lark-starter").read_bytes()[:4] == b"\x7fELF"
