"""Size limits of the compensation package (coec.compensate), beside the 500 lines of every module
(tests/unit/test_module_sizes.py): functions of at most 80 (the def line to the body's last line,
docstring included), at most 8 named parameters per signature (``self`` and ``*args`` /
``**kwargs`` aside), and typed options read as attributes, never by key."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "src" / "coec" / "compensate"
SOURCES = sorted(PACKAGE.rglob("*.py"))
MAX_FUNCTION_LINES, MAX_PARAMETERS = 80, 8


def _functions(path: Path) -> list[ast.FunctionDef | ast.AsyncFunctionDef]:
    tree = ast.parse(path.read_text())
    return [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]


def _name(path: Path, node: ast.AST) -> str:
    return f"{path.relative_to(PACKAGE)}:{getattr(node, 'lineno', '?')}"


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_function_sizes(path):
    long = {}
    wide = {}
    for fn in _functions(path):
        n = fn.end_lineno - fn.lineno + 1
        if n > MAX_FUNCTION_LINES:
            long[f"{_name(path, fn)} {fn.name}"] = n
        a = fn.args
        named = [p.arg for p in a.posonlyargs + a.args + a.kwonlyargs if p.arg not in ("self", "cls")]
        if len(named) > MAX_PARAMETERS:
            wide[f"{_name(path, fn)} {fn.name}"] = len(named)
    assert not long, f"functions over {MAX_FUNCTION_LINES} lines: {long}"
    assert not wide, f"signatures over {MAX_PARAMETERS} parameters: {wide}"


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_options_are_read_as_attributes(path):
    keyed = [
        _name(path, n)
        for n in ast.walk(ast.parse(path.read_text()))
        if isinstance(n, ast.Subscript)
        and isinstance(n.value, ast.Name)
        and n.value.id in ("o", "options")
        and isinstance(n.slice, ast.Constant)
        and isinstance(n.slice.value, str)
    ]
    assert not keyed, f"options read by key: {keyed}"
