"""The import structure of ``src/coec``, read from the source with ``ast``: the graph of imports
between the package's modules is acyclic (function-level imports count too: a deferred import
only hides a cycle), no module imports another module's ``_private`` name, and only the
registries load a module by its name.

And the job boundary, in fresh interpreters: every job of the workflow starts ``python -m coec
<stage>`` and every planning imports the wiring, so none of torch, transformers, pandas or
lm_eval may load before a stage runs: not on ``import coec.cli``, ``coec --help`` (and ``coec
iterative|search <cmd> --help``, ``coec kl-reference --help``), the config
validation or the modules the Snakefile imports with ``Wiring(config)`` (benchmarks/startup.py
measures the time)."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SRC = REPO / "src"


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


def reachable(edges: dict[str, set[str]], start: list[str]) -> set[str]:
    """Every module reachable from ``start`` (``start`` included)."""
    seen, todo = set(start), list(start)
    while todo:
        for v in edges[todo.pop()] - seen:
            seen.add(v)
            todo.append(v)
    return seen


@pytest.mark.parametrize("package", ["coec.iterative", "coec.select.search"])
def test_the_cli_adds_each_command_group_by_an_explicit_import(package):
    """``coec iterative`` and ``coec search`` come from plain imports of ``coec.iterative.cli`` and
    ``coec.select.search.cli``, which import nothing that leads back to ``coec.cli`` (the helpers
    they need are ``coec.cli_args``)."""
    edges, _ = import_edges(package_modules())
    assert f"{package}.cli" in edges["coec.cli"]
    group = [m for m in edges if m == package or m.startswith(f"{package}.")]
    back = reachable(edges, group)
    assert "coec.cli" not in back, sorted(m for m in group if "coec.cli" in reachable(edges, [m]))


def test_only_the_registries_load_a_module_by_name():
    """A module loaded by its name (``importlib.import_module``, ``__import__``) is an edge the
    graph above cannot see; only ``coec.registry`` does it: a plug-in, or a built-in entry
    declared lazily (its module registers it, so it imports the registry, never the reverse)."""
    by_name = set()
    for name, (path, _) in package_modules().items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Call):
                f = node.func
                called = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""
                if called in ("import_module", "__import__"):
                    by_name.add(name)
    assert by_name == {"coec.registry"}


# ----------------------------------------------------------------------------- the job boundary
HEAVY = ("torch", "transformers", "pandas", "lm_eval")

#: what every check below ends with: the heavy libraries loaded, one per line
REPORT = f"import sys\nprint('\\n'.join(m for m in {HEAVY} if m in sys.modules))\n"


def smk_imports() -> str:
    """The import lines of the Snakefile and the workflow's rules, as Python."""
    files = [REPO / "Snakefile", *sorted((REPO / "workflow" / "rules").glob("*.smk"))]
    lines = [ln for f in files for ln in f.read_text().splitlines() if re.match(r"(from|import) coec\b", ln)]
    assert lines
    return "\n".join(lines)


BOUNDARY = {
    "import coec.cli": "import coec.cli\n",
    "coec --help": """
import contextlib, io
from coec.cli import build_parser, main
stages = list(build_parser()._subparsers._group_actions[0].choices)
groups = [(g, build_parser()._subparsers._group_actions[0].choices[g]) for g in ("iterative", "search")]
cmds = [[g, c] for g, p in groups for c in p._subparsers._group_actions[0].choices]
for argv in [["--help"], *([s, "--help"] for s in stages), *([*c, "--help"] for c in cmds)]:
    with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):
        main(argv)
""",
    "coec kl-reference --help": """
import contextlib, io
from coec.cli import main
with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):
    main(["kl-reference", "--help"])
""",
    "config validation": """
import yaml
from coec.config.validate import validate_config
validate_config(yaml.safe_load(open("config.yaml")))
""",
    "the Snakefile's imports and Wiring(config)": """
import yaml
{smk}
config = yaml.safe_load(open("config.yaml"))
validate_config(config, SCHEMA)
W = Wiring(config)
IterativeWiring(W)
SearchWiring(W)
""",
}


def fresh(code: str) -> subprocess.CompletedProcess[str]:
    """``code`` in a fresh interpreter in the repository, this checkout's package first on the path
    and no plug-ins handed down."""
    env = {k: v for k, v in os.environ.items() if k != "COEC_PLUGINS"}
    env["PYTHONPATH"] = os.pathsep.join([str(SRC), *filter(None, [os.environ.get("PYTHONPATH")])])
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, env=env, timeout=300)


@pytest.mark.parametrize("what", list(BOUNDARY))
def test_the_job_boundary_loads_no_heavy_library(what):
    res = fresh(BOUNDARY[what].format(smk=smk_imports()) + REPORT)
    assert res.returncode == 0, res.stderr[-3000:]
    assert res.stdout.split() == [], f"{what} loads {res.stdout.split()}"


def test_registries_list_their_builtins_without_importing_them():
    """The compensation methods and export formats are declared lazily: listed, in order,
    without their modules; a lookup imports the module, which registers the entry in place."""
    res = fresh("""
import sys
from coec.compensate.methods import METHODS
from coec.export.formats import EXPORT_FORMATS
print(METHODS.names(), EXPORT_FORMATS.names())
print(sorted(m for m in sys.modules if m.startswith("coec.compensate.methods.") or m == "coec.export.stage"))
print(METHODS["coec"].name, [m.name for m in METHODS.values()], list(METHODS) == list(METHODS.names()))
print([f.name for f in EXPORT_FORMATS.values()], "coec.export.stage" in sys.modules)
""")
    assert res.returncode == 0, res.stderr[-3000:]
    assert res.stdout.splitlines() == [
        "('none', 'bias', 'lstsq', 'rcpu', 'coec', 'blend') ('hf', 'gguf')",
        "['coec.compensate.methods.base']",
        "coec ['none', 'bias', 'lstsq', 'rcpu', 'coec', 'blend'] True",
        "['hf', 'gguf'] True",
    ]
