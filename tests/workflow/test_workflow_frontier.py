"""The frontier's targets (results/frontier.csv, results/frontier_speed.csv) plan every job they
read: each cell's GGUF export of every named type (the -imatrix names with the cell's own
importance matrix; the dense model also at its own dense_types), its perplexity in llama.cpp, its
fp32 perplexity, the speed table, the join."""

from __future__ import annotations

from pathlib import Path

import yaml

from conftest import full_workflow_config, job_counts, snakemake

REPO = Path(__file__).resolve().parents[2]
FRONTIER = {
    "model": "tiny",
    "calibration": "c8",
    "types": ["f16", "q4_0", "q4_k_m-imatrix"],
    "dense_types": ["q2_k", "q3_k_m-imatrix"],
    "ratios": [0.5],
    "rows": [
        {"label": "RCPU + COEC", "selection": "rcpu", "compensation": "coec"},
        {"label": "FLAP + bias", "selection": "flap", "compensation": "bias"},
    ],
    "repeats": 1,
}


def test_frontier_plans_exports_perplexities_speed_and_the_table(tmp_path):
    cfg = full_workflow_config(tmp_path)
    cfg["frontier"] = FRONTIER
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(cfg))
    res = snakemake(
        tmp_path, "-n", "-p", "--cores", "1", "results/frontier.csv", "--configfile", str(tmp_path / "config.yaml")
    )
    jobs = job_counts(res.stdout)
    # 2 cells x 3 types exported and scored; the dense model's 3 and its 2 dense_types too
    assert jobs["export_gguf"] == 6 and jobs["export_gguf_dense"] == 5
    assert jobs["ppl_gguf_cell"] == 6 and jobs["ppl_gguf_dense"] == 5
    assert jobs["imatrix_cell"] == 2 and jobs["imatrix_dense"] == 1
    assert jobs["ppl_cell"] == 2 and jobs["ppl_dense"] == 1  # the fp32 column
    assert jobs["frontier_speed"] == 1 and jobs["frontier"] == 1
    speed = next(ln for ln in res.stdout.splitlines() if "report --kind table4-measured" in ln)
    assert "llamacpp-q4_k_m-imatrix" in speed and "results/frontier_speed.csv" in speed
    assert "llamacpp-q2_k" in speed and "llamacpp-q3_k_m-imatrix" in speed
    exports = [ln for ln in res.stdout.splitlines() if " export --format gguf " in ln]
    low = [ln for ln in exports if "--gguf-type q3_k_m " in ln or "--gguf-type q2_k " in ln]
    assert len(low) == 2 and all("results/tiny/dense/export-" in ln for ln in low)  # the dense model's alone
    assert sum("--imatrix" in ln for ln in low) == 1
    table = next(ln for ln in res.stdout.splitlines() if "report --kind frontier " in ln)
    assert "results/frontier.csv" in table


def test_a_searched_row_at_a_dense_files_size_plans_its_own_types_only(tmp_path):
    """A search whose budget is the dense model's q4_0 file spent in q4_k_m: one cell (the row's
    ratio), exported and scored at the row's types alone, its search job given that budget."""
    cfg = full_workflow_config(tmp_path)
    cfg["calibration"]["c8-holdout"] = dict(cfg["calibration"]["c8"], nsamples=4, seed=1, disjoint_from="c8")
    cfg.setdefault("selections", {})["obs-a8"] = {"score": "obs", "channel_multiple": 8}
    cfg["selections"]["search-at-q4_0"] = {
        "score": "search",
        "candidates": "obs-a8",
        "compensation": "coec",
        "holdout": "c8-holdout",
        "budget": {"dense": "q4_0", "type": "q4_k_m"},
        "tokens": [32, 64],
    }
    row = {"selection": "search-at-q4_0", "compensation": "coec", "ratios": [0.3], "types": ["q4_k_m-imatrix"]}
    cfg["frontier"] = dict(FRONTIER, rows=[row])
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(cfg))
    res = snakemake(
        tmp_path, "-n", "-p", "--cores", "1", "results/frontier.csv", "--configfile", str(tmp_path / "config.yaml")
    )
    jobs = job_counts(res.stdout)
    # the f16 file too: the speed harness reads its FLOP bound from it
    assert jobs["search"] == 1 and jobs["export_gguf"] == 2 and jobs["ppl_gguf_cell"] == 1
    search = next(ln for ln in res.stdout.splitlines() if " search run " in ln)
    assert '"dense": "q4_0"' in search and '"type": "q4_k_m"' in search and "search-at-q4_0" in search
    exports = [ln for ln in res.stdout.splitlines() if " export --format gguf " in ln and "search-at" in ln]
    export = next(ln for ln in exports if "f16" not in ln)
    assert "search-at-q4_0-0.3/coec/export-q4_k_m-imatrix.gguf" in export and "--imatrix" in export
