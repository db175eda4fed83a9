"""The slow tests of test_claims.py (a real embedded model, a Snakemake run of the whole chain or
several reruns): set slow for the whole file (CI's slow steps, or `pytest -m slow`)."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.slow


def test_dry_run_plans_claims(tmp_path):
    """`snakemake -n results/claims.md` plans the claims rule over the configured result tables."""
    from conftest import job_counts, snakemake

    res = snakemake(tmp_path, "-n", "-p", "results/claims.md")
    counts = job_counts(res.stdout)
    assert counts["claims"] == 1 and counts["table"] >= 3 and counts["table4"] == 1
    assert "report --kind claims" in res.stdout and "results/claims.md" in res.stdout
