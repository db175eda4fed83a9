"""A width search in the workflow (docs/search.md): a `score: search` selection's cell runs end to
end through the trimmed workflow (candidates per layer, the search, compensate, ppl) with
per-layer widths within the budget band; a new search option reruns the search and what reads
it, not the candidates; a new compensation of the search reruns its candidates; blend's
candidates take the held-out Grams and their base's candidates; bad search entries are refused
when the config is validated; paper.yaml plans its search table."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

from coec.config.validate import ConfigError, validate_config
from coec.io import artifacts
from conftest import REPO, job_counts, snakemake, write_trimmed_workflow

SEARCH = {
    "score": "search",
    "candidates": "obs-a8",
    "compensation": "coec",
    "holdout": "c8-holdout",
    "generations": 3,
    "offspring": 4,
    "survivors": [2, 1],
    "tokens": [32, 64],
}
CELL = "results/tiny/c8/search-obs-0.5"


@pytest.fixture(scope="module")
def trimmed(tmp_path_factory) -> dict:
    """The trimmed workflow's config, its model and text in a folder of the module."""
    return write_trimmed_workflow(tmp_path_factory.mktemp("trimmed"))[0]


def search_config(cfg: dict, **entry) -> dict:
    cfg = copy.deepcopy(cfg)
    cfg["calibration"]["c8-holdout"] = dict(cfg["calibration"]["c8"], nsamples=4, seed=1, disjoint_from="c8")
    cfg["selections"] = {"obs-a8": {"score": "obs", "channel_multiple": 8}, "search-obs": dict(SEARCH, **entry)}
    cfg["compensations"]["bias"] = {"method": "bias"}
    return cfg


def write(work: Path, cfg: dict, name: str) -> str:
    (work / name).write_text(yaml.safe_dump(cfg))
    return str(work / name)


def test_search_cell_end_to_end_and_what_a_change_reruns(tmp_path):
    base, _ = write_trimmed_workflow(tmp_path)
    cfg = search_config(base)
    path = write(tmp_path, cfg, "search.yaml")
    target = f"{CELL}/coec/ppl.json"
    snakemake(tmp_path, "--cores", "2", target, "--configfile", path)
    assert (tmp_path / target).is_file()
    keep = artifacts.read_keep(tmp_path / CELL / "keep.json", 2)
    record = artifacts.read_json(tmp_path / CELL / "search.json", "search")
    assert keep["selection"] == "search-obs" and keep["channel_multiple"] == 8
    widths = [{"kv_groups": len(k["kv_groups"]), "channels": len(k["channels"])} for k in keep["layers"]]
    assert widths == record["widths"] and all(w["channels"] % 8 == 0 for w in widths)
    lo, hi = record["budget"]["band"]
    assert lo <= record["cost"] <= hi and lo >= 0.995 * hi
    assert len(record["curve"]) == 3
    for i in range(2):
        assert (tmp_path / f"results/tiny/c8/search/obs-a8/coec/layer{i}.safetensors").is_file()

    res = snakemake(
        tmp_path, "-n", target, "--configfile", write(tmp_path, search_config(base, generations=4), "g4.yaml")
    )
    assert job_counts(res.stdout) == {"search": 1, "compensate": 2, "ppl_cell": 1, "total": 4}
    res = snakemake(
        tmp_path, "-n", target, "--configfile", write(tmp_path, search_config(base, compensation="bias"), "b.yaml")
    )
    assert job_counts(res.stdout) == {"search_candidates": 2, "search": 1, "compensate": 2, "ppl_cell": 1, "total": 6}


@pytest.mark.parametrize(
    "entry, message",
    [
        ({"candidates": "nope"}, "selections.search-obs.candidates: selection 'nope' is not registered"),
        ({"candidates": "search-obs"}, "selections.search-obs.candidates: selection 'search-obs' is itself a search"),
        ({"compensation": "nope"}, "selections.search-obs.compensation: unknown compensations entry 'nope'"),
        ({"holdout": "c9"}, "selections.search-obs.holdout: unknown calibration entry 'c9'"),
        (
            {"tokens": [32, 256]},
            "selections.search-obs.tokens: 256 fitness tokens, but calibration.c8-holdout holds 128",
        ),
        ({"survivors": [1, 2]}, "selections.search-obs.survivors must not increase"),
        ({"budget": {"bytes": 10, "type": "q9"}}, "selections.search-obs.budget.type"),
        ({"budget": {"dense": "q9", "type": "q4_k_m"}}, "selections.search-obs.budget.dense: unknown GGUF type 'q9'"),
        ({"channel_multiple": 16}, "selections.search-obs.channel_multiple: a search takes no channel_multiple"),
        ({"generations": 0}, "config: bad value at selections.search-obs.generations"),
    ],
)
def test_search_entries_refused_at_validation(trimmed, entry, message):
    cfg = search_config(trimmed, **entry)
    cfg["table1"]["rows"] = [{"selection": "search-obs", "compensation": "coec"}]
    with pytest.raises(ConfigError) as exc:
        validate_config(cfg)
    assert message in str(exc.value) and "\n" not in str(exc.value), str(exc.value)


def test_blend_candidates_read_the_base_candidates_and_the_holdout_grams(tmp_path):
    """A search whose compensation is blend: each layer's blend candidates take the held-out
    calibration's Grams and its base's (coec's) candidates of the same layer and selection, as a
    blend compensate job takes the held-out Grams and the base cell's block."""
    base, _ = write_trimmed_workflow(tmp_path)
    cfg = search_config(base, compensation="blend")
    cfg["compensations"]["blend"] = {"method": "blend", "base": "coec", "holdout": "c8-holdout"}
    res = snakemake(tmp_path, "-n", "-p", f"{CELL}/keep.json", "--configfile", write(tmp_path, cfg, "blend.yaml"))
    counts = job_counts(res.stdout)
    assert counts["search_candidates"] == 4 and counts["calibrate"] == 2, counts  # blend's and coec's; c8, c8-holdout
    blend = [ln for ln in res.stdout.splitlines() if " search candidates " in ln and '"method": "blend"' in ln]
    assert len(blend) == 2
    for layer, line in enumerate(sorted(blend, key=lambda ln: "--layer 1" in ln)):
        assert f'"base": "results/tiny/c8/search/obs-a8/coec/layer{layer}.safetensors"' in line, line
        assert '"holdout": "results/tiny/grams/c8-holdout"' in line, line


def test_paper_config_plans_the_search_table(tmp_path):
    res = snakemake(
        tmp_path, "-n", "-p", "--configfile", str(REPO / "workflow/configs/paper.yaml"), "--", "results/search_ppl.csv"
    )
    counts = job_counts(res.stdout)
    assert counts["search"] == 2 and counts["search_candidates"] == 32 + 28  # Llama-3.1-8B, Qwen2.5-7B
    assert "--generations 400 --offspring 64 --survivors '[8, 2, 1]' --tokens '[2048, 16384, 65536]'" in res.stdout
    assert "results/llama-3.1-8b/wikitext2-128x2048/search-rcpu-0.3/coec/ppl.json" in res.stdout
