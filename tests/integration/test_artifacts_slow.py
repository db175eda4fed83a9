"""The slow tests of test_artifacts.py (a real embedded model, a Snakemake run of the whole chain or
several reruns): set slow for the whole file (CI's slow steps, or `pytest -m slow`)."""

from __future__ import annotations

import pytest

from conftest import snakemake, write_trimmed_workflow
from test_artifacts import REPO, _digests  # noqa: F401  (helpers and fixtures)

pytestmark = pytest.mark.slow


def test_workflow_results_are_byte_identical_across_runs(tmp_path):
    """The trimmed tiny-model workflow run twice into two folders (same inputs): every file under
    results/ except logs/ and benchmarks/ has the same sha256."""
    shared = tmp_path / "inputs"
    shared.mkdir()
    _, cfg_path = write_trimmed_workflow(shared)
    digests = []
    for run in ("one", "two"):
        work = tmp_path / run
        targets = ["results/table1.csv", "results/tiny/c8/wanda_sp-0.5/coec/geometry.csv"]
        snakemake(work, "--cores", "2", *targets, "--configfile", str(cfg_path), timeout=1800)
        digests.append(
            {k: v for k, v in _digests(work / "results").items() if not k.startswith(("logs/", "benchmarks/"))}
        )
    assert len(digests[0]) >= 26
    differ = [k for k in digests[0] if digests[0][k] != digests[1].get(k)]
    assert sorted(digests[0]) == sorted(digests[1]) and not differ, differ
