"""The job's side (lark/job/) runs as the job's user: it imports the standard library, `protocol` and `errors`,
and nothing of larkd's side (daemon, kernel, policy, config, pyroute2, htcondor2). Checked on the source by AST,
so an import inside a function counts as much as one at the top."""
from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
LARK = REPO / "lark"
ALLOWED = {"lark.protocol", "lark.errors"}
# The package's own modules the allowed ones import in turn: checked by the same rule, below.
SHARED = [LARK / "protocol.py", LARK / "errors.py", LARK / "__init__.py"]


def module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def is_lark_module(name: str) -> bool:
    path = REPO.joinpath(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def imports(source: str, name: str, is_package: bool = False) -> list[tuple[int, str]]:
    """(line, module) for every import in module `name`'s source, nested ones included; relative imports
    resolved, and `from PKG import NAME` counted as PKG.NAME when NAME is a module of the package."""
    package = name if is_package else name.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(base + ([node.module] if node.module else []))
            else:
                base = node.module
            for a in node.names:
                sub = f"{base}.{a.name}"
                found.append((node.lineno, sub if base.split(".")[0] == "lark" and is_lark_module(sub) else base))
    return found


def offences(path: Path, allowed: set[str], name: str | None = None) -> list[str]:
    bad = []
    for line, mod in imports(path.read_text(), name or module_name(path), path.name == "__init__.py"):
        top = mod.split(".")[0]
        if top == "__future__" or (top != "lark" and top in sys.stdlib_module_names):
            continue
        if mod == "lark" or mod in allowed or mod.startswith("lark.job."):
            continue  # `lark` itself: the package's constants (__version__, PROTOCOL_VERSION), no imports
        bad.append(f"{path.name}:{line}: {mod}")
    return bad


JOB_FILES = sorted((LARK / "job").glob("*.py"))


def test_the_job_side_has_files_to_check():
    assert {p.name for p in JOB_FILES} >= {"wrapper.py", "starter_wrapper.py", "prepare_hook.py", "update_hook.py",
                                          "client.py"}


@pytest.mark.parametrize("path", JOB_FILES, ids=lambda p: p.name)
def test_job_side_imports_only_protocol_errors_and_the_standard_library(path):
    assert offences(path, ALLOWED) == []


@pytest.mark.parametrize("path", SHARED, ids=lambda p: p.name)
def test_what_the_job_side_may_import_is_standard_library_only(path):
    assert offences(path, {"lark.errors"}) == []


def test_the_check_sees_nested_relative_and_from_package_imports(tmp_path):
    # The rule must catch what a grep for "^from ..kernel" misses. Checked as if it were lark/job/probe.py.
    probe = tmp_path / "probe.py"
    probe.write_text("from .. import config\nimport os\n\n\ndef f():\n    from ..kernel.attach import x\n"
                     "    import pyroute2\n    from .. import __version__, protocol\n    from . import client\n"
                     "    import lark.daemon.server\n")
    assert offences(probe, ALLOWED, "lark.job.probe") == ["probe.py:1: lark.config", "probe.py:6: lark.kernel.attach",
                                                          "probe.py:7: pyroute2", "probe.py:10: lark.daemon.server"]


def test_every_job_module_imports_without_site_packages():
    """The same at run time: with -S (no site-packages, so no pyroute2 or htcondor2) every module of lark/job/
    imports, and none of larkd's side is loaded."""
    mods = [module_name(p) for p in JOB_FILES]
    code = (f"import sys; sys.path.insert(0, {str(REPO)!r}); import importlib\n"
            f"for m in {mods!r}: importlib.import_module(m)\n"
            "print(sorted(m for m in sys.modules if m.startswith('lark.') and not m.startswith('lark.job')))")
    cp = subprocess.run([sys.executable, "-I", "-S", "-c", code], capture_output=True, text=True)
    assert cp.returncode == 0, cp.stderr
    assert cp.stdout.strip() == "['lark.errors', 'lark.protocol']"


def test_starter_wrapper_advertises_what_the_configuration_offers(monkeypatch, tmp_path):
    from lark.job import starter_wrapper
    cfg = tmp_path / "lark.toml"
    cfg.write_text('[network]\nbridge_range = "192.0.2.100-192.0.2.199"\nbridge_gateway = "192.0.2.1"\n')
    monkeypatch.setenv("LARK_CONFIG", str(cfg))
    types = starter_wrapper.network_types()
    assert types[:2] == ["nat", "bridge"] and types[-1] == "none"
    cfg.write_text('[network]\nbridge_range = "not a range"\n')  # a config error keeps the basic types
    assert starter_wrapper.network_types() == ["nat", "none"]
