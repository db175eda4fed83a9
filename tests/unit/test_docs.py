"""The documentation stands alone: short README with the quick-start commands CI runs, every
local link and anchor in README.md and docs/ resolves, nothing refers outside the repository."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOCS = sorted((REPO / "docs").glob("*.md"))
QUICK_START = [
    "bash scripts/setup.sh && .venv/bin/snakemake --cores all results/table1.csv",
    "bash scripts/setup.sh && .venv/bin/python -m pytest -q",
]


def anchors(markdown: str) -> set[str]:
    """GitHub-style heading anchors of a Markdown text (code blocks skipped)."""
    out, code = set(), False
    for line in markdown.splitlines():
        if line.startswith("```"):
            code = not code
        m = None if code else re.match(r"^#+\s+(.*)$", line)
        if m:
            out.add(re.sub(r"[^\w\- ]", "", m.group(1).strip().lower()).replace(" ", "-"))
    return out


def local_links(path: Path) -> list[str]:
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)
    return [m for m in re.findall(r"\]\(([^)\s]+)\)", text) if not re.match(r"[a-z]+:", m)]


def test_readme_is_short_and_keeps_the_quick_start():
    text = (REPO / "README.md").read_text()
    assert len(text.splitlines()) <= 200
    for cmd in QUICK_START:
        assert cmd in text, cmd
    assert QUICK_START[1] in (REPO / ".ci" / "run").read_text()  # CI runs the README's test command
    for section in ("## Quick start", "## What runs", "## Reliability", "## Documentation"):
        assert section in text, section


@pytest.mark.parametrize("page", [REPO / "README.md", *DOCS], ids=lambda p: p.name)
def test_local_links_resolve(page):
    bad = []
    for link in local_links(page):
        path, _, anchor = link.partition("#")
        target = (page.parent / path) if path else page
        if not target.exists():
            bad.append(f"{link}: no such file")
        elif anchor and target.suffix == ".md" and anchor not in anchors(target.read_text()):
            bad.append(f"{link}: no such heading")
    assert not bad, f"{page.name}: {bad}"


def test_docs_index_links_every_page():
    linked = set(local_links(REPO / "docs" / "index.md"))
    missing = [p.name for p in DOCS if p.name != "index.md" and p.name not in linked]
    assert not missing, f"docs/index.md does not link {missing}"


def test_nothing_refers_outside_the_repository():
    files = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    pattern = re.compile(r"DESIGN\.md|\bseeds/|\.\./shared|seed-00")
    hits = []
    for name in files:
        path = REPO / name
        if (
            path.suffix not in {".py", ".md", ".smk", ".yaml", ".yml", ".sh", ".toml", ".txt", ""}
            or not path.is_file()
            or name == "tests/unit/test_docs.py"
        ):
            continue
        try:
            text = path.read_text()
        except UnicodeDecodeError:
            continue
        hits += [f"{name}:{i}" for i, line in enumerate(text.splitlines(), 1) if pattern.search(line)]
    assert not hits, hits
