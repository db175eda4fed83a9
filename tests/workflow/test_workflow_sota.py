"""The state-of-the-art table (``table_sota``, docs/sota.md) as planned: config.yaml's table on the
embedded model (every row's cell: keep set, compensation, perplexity with its KL, zero-shot; the
searches and their candidates) and paper.yaml's on Llama-3.1-8B and Qwen2.5-7B."""

from __future__ import annotations

import yaml

from conftest import REPO, job_counts, snakemake


def test_config_yaml_plans_table_sota(tmp_path):
    cfg = yaml.safe_load((REPO / "config.yaml").read_text())
    rows = cfg["table_sota"]["rows"]
    searches = {r["selection"] for r in rows if cfg["selections"].get(r["selection"], {}).get("score") == "search"}
    # a layer's candidates per (levels, refit): blend's also need its base's (coec) candidates
    refits = {(cfg["selections"][s]["candidates"], cfg["selections"][s]["compensation"]) for s in searches}
    refits |= {(c, cfg["compensations"][m]["base"]) for c, m in refits if cfg["compensations"][m]["method"] == "blend"}
    res = snakemake(tmp_path, "-n", "-p", "results/table_sota.csv")
    counts = job_counts(res.stdout)
    assert counts["table_sota"] == 1 and counts["ppl_cell"] == counts["zeroshot_cell"] == len(rows)
    assert searches == {"search-obs", "alam-flap", "search-obs-blend"}
    assert counts["search"] == len(searches) and counts["search_candidates"] == 30 * len(refits) == 30 * 4
    assert counts["kl_reference"] == 1 and counts["ppl_dense"] == 1 and counts["zeroshot_dense"] == 1
    for row in rows:
        assert (
            f"results/smollm2-135m/enwiki-32x512/{row['selection']}-0.3/{row['compensation']}/zeroshot.json"
            in res.stdout
        )
    # the search's budget: the uniform obs cell's prunable parameters (unaligned widths)
    assert """--budget '{"uniform": {"channel_multiple": 1, "channel_rounding": "ceil"}}'""" in res.stdout
    assert "--allocation alam" in res.stdout and "--kind sota" in res.stdout
