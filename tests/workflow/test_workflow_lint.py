"""`snakemake --lint` of the workflow: no finding beyond the short justified list
(scripts/lint_workflow.py ALLOWED; docs/design.md "Lint")."""

from __future__ import annotations

import importlib.util
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("lint_workflow", REPO / "scripts" / "lint_workflow.py")
lint = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(lint)

SAMPLE = f"""Lints for snakefile {REPO}/workflow/rules/report.smk:
    * Mixed rules and functions in same snakefile.:
      Small one-liner functions used only once should be defined as lambda

Lints for rule table (line 4, {REPO}/workflow/rules/report.smk):
    * Shell command directly uses variable PY from outside of the rule:
      It is recommended to pass all files as input and output, and non-file

Lints for rule select (line 4, {REPO}/workflow/rules/select.smk):
    * Do not access input and output files individually by index in shell commands:
      When individual access to input or output files is needed (i.e., just
"""


def test_findings_are_parsed_and_only_justified_ones_pass():
    found = lint.findings(SAMPLE)
    assert found == [
        ("workflow/rules/report.smk", "Mixed rules and functions in same snakefile."),
        ("table", "Shell command directly uses variable PY from outside of the rule"),
        ("select", "Do not access input and output files individually by index in shell commands"),
    ]
    # mixed rules and functions is never justified; output[0] only in the zero-shot rules
    assert lint.unjustified(found) == [found[0], found[2]]


def test_workflow_lint_has_no_new_findings():
    res = lint.lint_report()
    found = lint.findings(res.stdout + res.stderr)
    assert found or res.returncode == 0, (res.stdout + res.stderr)[-3000:]
    assert not lint.unjustified(found), lint.unjustified(found)
    # every justified kind is still needed (else drop it from the list)
    assert {t for _, t in found} == set(lint.ALLOWED)
