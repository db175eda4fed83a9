"""paper.yaml's state-of-the-art table planned on Llama-3.1-8B and Qwen2.5-7B (docs/sota.md): a
dry run of about 1,000 jobs (slow tier)."""

from __future__ import annotations

import pytest

from conftest import REPO, job_counts, snakemake

pytestmark = pytest.mark.slow


def test_paper_yaml_plans_table_sota(tmp_path):
    res = snakemake(
        tmp_path, "-n", "-p", "--configfile", str(REPO / "workflow/configs/paper.yaml"), "--", "results/table_sota.csv"
    )
    counts = job_counts(res.stdout)
    # three searches a model (obs levels refit by lstsq, by blend; FLAP's levels for AL-AM), four sets of
    # candidates (obs: lstsq, coec (blend's base), blend; FLAP: none), Llama-3.1-8B's 32 layers, Qwen2.5-7B's 28
    assert counts["search"] == 2 * 3 and counts["search_candidates"] == 4 * (32 + 28)
    assert counts["ppl_cell"] == counts["zeroshot_cell"] == 2 * 13 and counts["kl_reference"] == 2
    assert "--generations 400 --offspring 64" in res.stdout
    assert "results/qwen2.5-7b/wikitext2-128x2048/search-obs-0.3/blend/ppl.json" in res.stdout
