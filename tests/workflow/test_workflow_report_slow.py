"""The slow tests of test_workflow_report.py (a real embedded model, a Snakemake run of the whole chain or
several reruns): set slow for the whole file (CI's slow steps, or `pytest -m slow`)."""

from __future__ import annotations

import html
import json
import re
from pathlib import Path

import pytest

from test_workflow_report import _results, report_html  # noqa: F401  (helpers and fixtures)

pytestmark = pytest.mark.slow


def test_report_lists_every_artifact_with_caption_and_category(report_html):
    results = _results(report_html)
    by_path = {Path(p).as_posix(): r for p, r in results.items()}
    assert set(by_path) == {
        "results/table1.csv",
        "results/table4.csv",
        "results/appC.csv",
        "results/figures/appC_angles.png",
        "results/figures/fig2_calibration_size.png",
        "results/table_iterative.csv",
    }
    t1 = by_path["results/table1.csv"]
    assert t1["labels"] == {"artifact": "Table 1: perplexity at 50 % column sparsity"}
    caption = html.unescape(t1["caption"])
    assert "Perplexity" in caption and "Calibration" in caption and "c8" in caption
    rows = re.findall(r"<tr>(.*?)</tr>", caption, re.S)  # the table itself, in the caption
    # the shared run's rows (tests/conftest.py::shared_config) and the dense row, below the header
    assert len(rows) == 1 + 8 and "Wanda-sp" in caption and "RCPU" in caption
    for path, r in by_path.items():
        assert r["caption"].strip(), path
        assert not r["caption"].count("{{"), path
    cats = re.search(r"var categories = (\{.*?\});\n", report_html)
    cats = json.loads(cats.group(1))
    assert set(cats) == {"Tables", "Figures", "Geometry", "Iterative"}
    assert set(cats["Tables"]) == {"Perplexity", "Deployment cost"}
    assert "Tables" in report_html and "workflow" in report_html.lower()
