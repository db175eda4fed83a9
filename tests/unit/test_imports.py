"""The import structure of ``src/coec``, read from the source with ``ast``: the graph of imports
between the package's modules is acyclic (function-level imports count too: a deferred import
only hides a cycle) and no module imports another module's ``_private`` name."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"


def package_modules(src: Path = SRC) -> dict[str, tuple[Path, bool]]:
    """Dotted name -> (file, is a package ``__init__``) of every module under ``src/coec``."""
    out = {}
    for path in sorted((src / "coec").rglob("*.py")):
        parts = list(path.relative_to(src).with_suffix("").parts)
        is_pkg = parts[-1] == "__init__"
        out[".".join(parts[:-1] if is_pkg else parts)] = (path, is_pkg)
    return out


def absolute(module: str | None, importer: str, level: int, is_pkg: bool) -> str:
    """The absolute name of ``from <level dots><module> import ...`` inside ``importer``."""
    if level == 0:
        return module or ""
    base = importer.split(".") if is_pkg else importer.split(".")[:-1]
    base = base[: len(base) - (level - 1)]
    return ".".join(base + ([module] if module else []))


def import_edges(modules: dict[str, tuple[Path, bool]]) -> tuple[dict[str, set[str]], list[str]]:
    """(module -> the package modules it imports, ``importer: module._name`` private imports)."""
    edges, private = {}, []
    for name, (path, is_pkg) in modules.items():
        targets = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom):
                source = absolute(node.module, name, node.level, is_pkg)
                for alias in node.names:
                    if f"{source}.{alias.name}" in modules:  # ``from pkg import submodule``
                        targets.add(f"{source}.{alias.name}")
                        continue
                    targets.add(source)
                    if alias.name.startswith("_") and source in modules and source != name:
                        private.append(f"{name}: {source}.{alias.name}")
        edges[name] = {t for t in targets if t in modules and t != name}
    return edges, private


def find_cycle(edges: dict[str, set[str]]) -> list[str] | None:
    """One cycle of the directed graph as [a, b, ..., a], or None (depth-first search)."""
    state, stack = {}, []

    def visit(u):
        state[u] = "open"
        stack.append(u)
        for v in sorted(edges[u]):
            if state.get(v) == "open":
                return stack[stack.index(v) :] + [v]
            if v not in state and (cycle := visit(v)):
                return cycle
        stack.pop()
        state[u] = "done"
        return None

    for u in sorted(edges):
        if u not in state and (cycle := visit(u)):
            return cycle
    return None


def test_the_checker_sees_cycles_and_private_imports(tmp_path):
    pkg = tmp_path / "coec"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("def f():\n    from .sub.b import g\n")
    (pkg / "sub" / "__init__.py").write_text("from .b import g\n")
    (pkg / "sub" / "b.py").write_text("from ..a import _helper\n")
    edges, private = import_edges(package_modules(tmp_path))
    assert edges["coec.a"] == {"coec.sub.b"} and edges["coec.sub"] == {"coec.sub.b"}
    assert find_cycle(edges) == ["coec.a", "coec.sub.b", "coec.a"]
    assert private == ["coec.sub.b: coec.a._helper"]


def test_package_imports_are_acyclic():
    edges, _ = import_edges(package_modules())
    assert "coec.cli" in edges and "coec.iterative" in edges
    assert find_cycle(edges) is None, " -> ".join(find_cycle(edges))


def test_no_module_imports_another_modules_private_names():
    _, private = import_edges(package_modules())
    assert not private, private
