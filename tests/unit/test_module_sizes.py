"""Every module of the package (src/coec, every subpackage) is at most 500 lines: a module that
grows past it is split by idea (tests/unit/test_compensate_structure.py adds function sizes for
coec.compensate)."""

from __future__ import annotations

from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "src" / "coec"
SOURCES = sorted(PACKAGE.rglob("*.py"))
MAX_MODULE_LINES = 500


def test_the_package_is_found():
    assert len(SOURCES) > 100 and PACKAGE / "artifacts.py" in SOURCES


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_module_is_at_most_500_lines(path):
    lines = len(path.read_text().splitlines())
    assert lines <= MAX_MODULE_LINES, f"{path.relative_to(PACKAGE)}: {lines} lines (at most {MAX_MODULE_LINES})"
