"""`lark install-hook`'s checks, before anything is compiled or installed (the launcher itself, and the race it
closes, are in tests/integration/test_security_hooks.py)."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from lark import hook_launcher
from lark.errors import LarkError


def test_a_file_others_may_write_is_not_only_roots(tmp_path):
    f = tmp_path / "hook.py"
    f.write_text("")
    f.chmod(0o666)
    why = hook_launcher.only_root_can_replace(f)
    assert why is not None and (os.geteuid() != 0 or "writable" in why)   # not root: the owner is named first


def test_a_file_in_a_directory_others_may_write_is_not_only_roots(tmp_path):
    d = tmp_path / "bin"
    d.mkdir()
    f = d / "hook.py"
    f.write_text("")
    d.chmod(0o777)                      # no sticky bit: anyone may rename the file away and put another there
    assert str(d) in hook_launcher.only_root_can_replace(f)


@pytest.mark.skipif(os.geteuid() != 0, reason="root-owned files need root")
def test_root_owned_files_in_a_sticky_world_writable_directory_are_only_roots(tmp_path):
    d = tmp_path / "sticky"
    d.mkdir()
    d.chmod(0o1777)
    f = d / "hook.py"
    f.write_text("")
    assert hook_launcher.only_root_can_replace(f) is None


def test_install_refuses_a_script_others_could_replace_before_compiling_anything(tmp_path):
    d = tmp_path / "bin"
    d.mkdir()
    (d / "hook.py").write_text("")
    d.chmod(0o777)
    with pytest.raises(LarkError, match="not only root controls"):
        hook_launcher.install(tmp_path / "out" / "lark-prepare-job", Path("/usr/bin/env"), d / "hook.py", 0,
                              cc="/nonexistent-cc")
    assert not (tmp_path / "out" / "lark-prepare-job").exists()


@pytest.mark.parametrize("path", ['/opt/a"b/python', "/opt/a\\b/python", "/opt/a\nb/python", "python"])
def test_paths_compiled_into_the_launcher_are_plain_absolute_strings(path):
    with pytest.raises(LarkError, match="absolute path"):
        hook_launcher._c_string("interpreter", Path(path))


def test_doctor_says_what_is_wrong_with_a_hook_that_is_not_the_launcher(tmp_path):
    script = tmp_path / "lark-prepare-job"
    script.write_text("#!/opt/lark/bin/python\nfrom lark.job.prepare_hook import main\n")
    assert "not the setgid launcher" in hook_launcher.launcher_problem(str(script))
    fake = tmp_path / "fake-launcher"
    fake.write_bytes(b"\x7fELF..." + hook_launcher.MARKER + b"...")
    fake.chmod(0o755)
    assert "no setgid group" in hook_launcher.launcher_problem(str(fake))
    assert "unreadable" in hook_launcher.launcher_problem(str(tmp_path / "absent"))
