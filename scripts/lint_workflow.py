"""`snakemake --lint` of the workflow, failing on any finding not justified below.

    .venv/bin/python scripts/lint_workflow.py        # exit 1 on a new finding (CI runs this)

Snakemake 9's `--lint json` prints the text report (the CLI drops the format), so the text is
parsed: every "Lints for rule X (...)" / "Lints for snakefile F" heading and its "* title" lines.
The findings that stay are in ALLOWED, each with its reason (docs/design.md, "Lint").
"""

from __future__ import annotations

import re
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# title -> the rules it may name (None: every rule)
ALLOWED = {
    # PY (common.smk) is the absolute path of the environment's `coec` entry point: as a param it
    # would be a rerun trigger, replanning every result whenever the clone or its venv moves.
    "Shell command directly uses variable PY from outside of the rule": None,
    # {output[0]} is the zero-shot summary (zs_outputs lists it first); the shell text is a rerun
    # trigger (Snakemake's `code`), so renaming it would rerun every zero-shot job already done.
    "Do not access input and output files individually by index in shell commands": {
        "zeroshot_dense",
        "zeroshot_cell",
        "iterative_zeroshot",
    },
}


def lint_report(python: str = sys.executable) -> subprocess.CompletedProcess[str]:
    """Run `snakemake --lint` on the repository's Snakefile (embedded default config)."""
    with tempfile.TemporaryDirectory(prefix="coec-lint-") as work:
        return subprocess.run(
            [python, "-m", "snakemake", "--snakefile", str(REPO / "Snakefile"), "--directory", work, "--lint"],
            capture_output=True,
            text=True,
            cwd=REPO,
        )


def findings(text: str) -> list[tuple[str, str]]:
    """(where, title) of every finding of a text lint report; where = a rule name or a
    snakefile path relative to the repository."""
    out, where = [], None
    for line in text.splitlines():
        m = re.match(r"Lints for (?:rule (\S+) \(line \d+, .*\)|snakefile (.+)):$", line)
        if m:
            where = m.group(1) or Path(m.group(2)).resolve().relative_to(REPO).as_posix()
            continue
        m = re.match(r"    \* (.+?):$", line)
        if m and where:
            out.append((where, m.group(1)))
    return out


def unjustified(found: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """The findings the allow-list does not cover."""

    def allowed(where: str, title: str) -> bool:
        rules = ALLOWED.get(title, set())
        return rules is None or where in rules

    return [(w, t) for w, t in found if not allowed(w, t)]


def main() -> int:
    res = lint_report()
    text = res.stdout + res.stderr
    found = findings(text)
    if res.returncode and not found:  # failed before linting (a config or syntax error)
        print(text[-3000:], file=sys.stderr)
        return 1
    bad = unjustified(found)
    for where, title in bad:
        print(f"lint: {where}: {title}", file=sys.stderr)
    print(f"snakemake --lint: {len(found)} findings, {len(found) - len(bad)} justified, {len(bad)} new")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
