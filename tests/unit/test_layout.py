"""The package's floor plan: one package per pipeline step, a top level a newcomer reads at a
glance, and every module one idea that its docstring names (docs/design.md "The house").

A module is split or merged by idea, not by size: its docstring's first line says what the one
idea is, and the top level is the list below, which docs/design.md draws."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "src" / "coec"
SOURCES = sorted(p for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts)
DESIGN = Path(__file__).resolve().parents[2] / "docs" / "design.md"

#: The pipeline's steps, in order, then what serves them. Adding a top-level entry means adding
#: it here and to docs/design.md's drawing.
STEPS = ("data", "calibrate", "select", "compensate", "evaluate", "export", "report")
FLOORS = ("config", "io", "model", "iterative", "workflow")
MODULES = ("__init__.py", "__main__.py", "api.py", "cli.py", "cli_args.py", "registry.py")


def top_level() -> set[str]:
    return {p.name for p in PACKAGE.iterdir() if p.name != "__pycache__" and (p.is_dir() or p.suffix == ".py")}


def test_the_top_level_is_the_floor_plan():
    assert top_level() == set(STEPS) | set(FLOORS) | set(MODULES)
    assert len(top_level()) <= 18


@pytest.mark.parametrize("name", STEPS + FLOORS)
def test_each_package_says_what_it_is_and_the_design_names_it(name):
    init = PACKAGE / name / "__init__.py"
    assert init.is_file(), f"{name}/ is not a package"
    assert ast.get_docstring(ast.parse(init.read_text())), f"{name}/__init__.py has no docstring"
    assert f"{name}/" in DESIGN.read_text(), f"docs/design.md does not name {name}/"


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_every_module_names_its_one_idea(path):
    if path.name == "__main__.py":
        return
    doc = ast.get_docstring(ast.parse(path.read_text()))
    assert doc and doc.split("\n")[0].strip(), f"{path.relative_to(PACKAGE)}: no docstring naming its idea"
