"""The import graph of `lark/` has no cycles (issue 24 item 7).

Every import counts as an edge: at module level, inside functions, and under `if TYPE_CHECKING:` alike. An
import moved into a function, or kept for annotations only, still couples the two modules (neither can be
understood, tested or reused without the other); counting only module-level imports would let a cycle pass by
being hidden, which is how the cycles of issue 24 were kept alive.

A `from pkg import name` counts as an edge to `pkg.name` when that is a module of `lark/`, else to `pkg`
(the package's `__init__`, where `name` is defined).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE_ROOT = Path(__file__).resolve().parents[2] / "lark"


def module_name(path: Path, root: Path) -> str:
    """The dotted name of a source file under the package directory root (a package's `__init__.py` is the
    package itself)."""
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def all_imports(tree: ast.AST) -> list[ast.Import | ast.ImportFrom]:
    """Every import statement in the tree, at any depth."""
    return [node for node in ast.walk(tree) if isinstance(node, ast.Import | ast.ImportFrom)]


def resolve_base(importer: str, is_package: bool, node: ast.ImportFrom) -> str:
    """The absolute module a `from ... import` names, relative levels resolved against the importer."""
    if node.level == 0:
        return node.module or ""
    package = importer.split(".") if is_package else importer.split(".")[:-1]
    anchor = package[: len(package) - (node.level - 1)]
    return ".".join(anchor + ([node.module] if node.module else []))


def import_graph(root: Path = PACKAGE_ROOT) -> dict[str, set[str]]:
    """Module -> the modules of the same package it imports."""
    sources = {module_name(path, root): path for path in sorted(root.rglob("*.py"))}
    graph: dict[str, set[str]] = {name: set() for name in sources}
    for importer, path in sources.items():
        is_package = path.name == "__init__.py"
        for node in all_imports(ast.parse(path.read_text(), filename=str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                base = resolve_base(importer, is_package, node)
                for alias in node.names:
                    submodule = f"{base}.{alias.name}"
                    targets.append(submodule if submodule in sources else base)
            for target in targets:
                # `import lark.a.b` imports the module itself; an unknown dotted name falls back to its
                # longest known prefix (a package's attribute).
                while target and target not in sources:
                    target = target.rpartition(".")[0]
                if target and target != importer:
                    graph[importer].add(target)
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle as a path that starts and ends at the same module, or None (iterative depth-first search)."""
    done: set[str] = set()
    for start in sorted(graph):
        if start in done:
            continue
        path: list[str] = [start]
        on_path: set[str] = {start}
        iterators = [iter(sorted(graph[start]))]
        while iterators:
            successor = next(iterators[-1], None)
            if successor is None:
                iterators.pop()
                finished = path.pop()
                on_path.discard(finished)
                done.add(finished)
                continue
            if successor in on_path:
                return [*path[path.index(successor):], successor]
            if successor in done:
                continue
            path.append(successor)
            on_path.add(successor)
            iterators.append(iter(sorted(graph[successor])))
    return None


def test_lark_import_graph_has_no_cycles() -> None:
    graph = import_graph()
    assert len(graph) > 50, f"found only {len(graph)} modules under {PACKAGE_ROOT}: wrong root?"
    cycle = find_cycle(graph)
    assert cycle is None, (
        "import cycle in lark/: " + " -> ".join(cycle or [])
        + "; move what both sides need into a lower module both can import")


@pytest.mark.parametrize("source, expected", [
    # a function-level import is an edge like a module-level one
    ({"a.py": "def f():\n    from . import b\n", "b.py": "import pkg.a\n"}, ["pkg.a", "pkg.b", "pkg.a"]),
    # relative imports from a subpackage, and `from package import module`
    ({"sub/__init__.py": "", "sub/x.py": "from ..y import thing\n", "y.py": "from pkg.sub import x\n"},
     ["pkg.sub.x", "pkg.y", "pkg.sub.x"]),
    # an import for type checking only is an edge too
    ({"a.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg import b\n",
      "b.py": "from pkg import a\n"}, ["pkg.a", "pkg.b", "pkg.a"]),
    # no cycle: a chain, and a package importing its own submodule
    ({"a.py": "from . import b\n", "b.py": "import json\nfrom pkg import c\n", "c.py": "",
      "sub/__init__.py": "from .x import y\n", "sub/x.py": "y = 1\n"}, None),
])
def test_cycle_finder_sees_cycles_through_every_kind_of_import(
        tmp_path: Path, source: dict[str, str], expected: list[str] | None) -> None:
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    for relative, text in source.items():
        (package / relative).parent.mkdir(parents=True, exist_ok=True)
        (package / relative).write_text(text)
    assert find_cycle(import_graph(package)) == expected
