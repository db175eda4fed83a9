"""The size–quality–speed frontier (coec.report.frontier): its cells from the config, the Pareto front,
the table joined from the per-file results, and its refusals."""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path

import pandas as pd
import pytest
import yaml

from coec.config.validate import ConfigError, validate_config
from coec.io import paths
from coec.report.frontier import frontier_cells, frontier_inputs, frontier_spec, pareto, speed_spec, write_frontier

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def config():
    return validate_config(yaml.safe_load((REPO / "config.yaml").read_text()))


def test_pareto_front_by_hand():
    """A point is on the front unless another is strictly smaller and strictly better."""
    sizes = [100, 80, 120, 80, 60, 90, float("nan")]
    ppls = [10, 12, 9, 12, 30, 13, 1]
    # 90/13 is dominated by 80/12; the two equal 80/12 points do not dominate each other
    assert pareto(sizes, ppls) == [True, True, True, True, True, False, False]
    assert pareto([1.0], [1.0]) == [True]
    assert pareto([1, 2], [2, 1]) == [True, True] and pareto([1, 2], [1, 2]) == [True, False]


def test_cells_are_dense_then_every_row_at_every_ratio(config):
    cells = frontier_cells(config)
    t = config["frontier"]
    assert cells[0]["label"] == "dense" and cells[0]["keep"] is None
    assert len(cells) == 1 + sum(len(row.get("ratios", t["ratios"])) for row in t["rows"])
    aligned = [c for c in cells if c["selection"] == "rcpu-a256"]
    assert aligned and all("rcpu-a256-" in c["keep"] for c in aligned)
    assert cells[1]["folder"] == paths.cell_dir("smollm2-135m", "enwiki-32x512", "rcpu", 0.1, "coec")


def test_a_row_may_name_its_own_ratios_and_types(config):
    """The searched rows at a dense file's size: one cell each, at the row's types only."""
    searched = [c for c in frontier_cells(config) if c["selection"].startswith("search-")]
    assert [(c["selection"], c["ratio"], c["types"]) for c in searched] == [
        ("search-obs-blend-at-q4_k_m", 0.3, ["q5_k_m"]),
        ("search-obs-blend-at-q4_0", 0.3, ["q4_k_m", "q4_k_m-imatrix"]),
    ]
    inputs = frontier_inputs(config)
    folder = searched[0]["folder"]
    assert paths.gguf_ppl_file(folder, "q5_k_m") in inputs and paths.gguf_ppl_file(folder, "q4_0") not in inputs
    raw = copy.deepcopy(yaml.safe_load((REPO / "config.yaml").read_text()))
    raw["frontier"]["rows"][0]["types"] = ["q3_k_m"]
    raw["frontier"]["dense_types"] = []
    with pytest.raises(ConfigError, match=r"frontier\.rows\[0\]\.types: 'q3_k_m' is not among the dense model's types"):
        frontier_cells(validate_config(raw))


def _row_of_each_cell(t: dict) -> list[dict]:
    return [row for row in t["rows"] for _ in row.get("ratios", t["ratios"])]


def test_the_dense_model_alone_gets_the_mixes_below_4_bits(config):
    """config.yaml's dense_types: llama.cpp's mixes below 4 bits with and without the importance
    matrix, exported, scored and timed for the dense cell only, after the types every cell has."""
    t = config["frontier"]
    below4 = ["iq4_xs", "q3_k_m", "q3_k_s", "q2_k"]
    assert t["dense_types"] == [v for b in below4 for v in (b, f"{b}-imatrix")]
    cells = frontier_cells(config)
    assert cells[0]["types"] == [*t["types"], *t["dense_types"]]
    assert all(c["types"] == t["types"] for c, row in zip(cells[1:], _row_of_each_cell(t)) if "types" not in row)
    spec = frontier_spec(config)
    assert spec["types"] == cells[0]["types"]
    inputs = set(frontier_inputs(config))
    dense = paths.dense_dir("smollm2-135m")
    for g in t["dense_types"]:
        assert {paths.gguf_file(dense, g), paths.gguf_report_file(dense, g), paths.gguf_ppl_file(dense, g)} <= inputs
        assert not any(paths.gguf_ppl_file(c["folder"], g) in inputs for c in cells[1:])
    speed = speed_spec(config)
    assert [r.removeprefix("llamacpp-") for r in speed["runtimes"]] == spec["types"]
    assert set(speed["cells"][0]["gguf"]) == {"f16", *spec["types"]}
    rows = _row_of_each_cell(t)
    assert all(set(c["gguf"]) == {"f16", *row.get("types", t["types"])} for c, row in zip(speed["cells"][1:], rows))
    cfg = copy.deepcopy(config)
    cfg["frontier"]["dense_types"] = ["q4_0", "q2_k"]  # one already in types: not twice
    assert frontier_cells(cfg)[0]["types"] == [*t["types"], "q2_k"]
    raw = yaml.safe_load((REPO / "config.yaml").read_text())
    del raw["frontier"]["dense_types"]  # the schema's default is config.yaml's
    assert validate_config(raw)["frontier"]["dense_types"] == t["dense_types"]


def test_speed_spec_times_every_type_and_keeps_the_f16_file_for_the_bounds(config):
    cfg = copy.deepcopy(config)
    cfg["frontier"]["types"] = ["q4_0", "q4_k_m-imatrix"]
    cfg["frontier"]["dense_types"] = []
    cfg["frontier"]["rows"] = [r for r in cfg["frontier"]["rows"] if "types" not in r]
    spec = speed_spec(cfg)
    assert spec["runtimes"] == ["llamacpp-q4_0", "llamacpp-q4_k_m-imatrix"]
    assert all(set(c["gguf"]) == {"f16", "q4_0", "q4_k_m-imatrix"} for c in spec["cells"])
    assert spec["repeats"] == cfg["frontier"]["repeats"]
    inputs = frontier_inputs(cfg)
    assert paths.table_file("frontier_speed") in inputs
    assert paths.gguf_ppl_file(paths.dense_dir("smollm2-135m"), "q4_k_m-imatrix") in inputs
    assert not any(i.endswith("ppl-gguf-f16.json") for i in inputs)  # f16 only for the bounds


@pytest.mark.parametrize(
    "change,match",
    [
        ({"model": "nope"}, r"frontier\.model: unknown model 'nope'"),
        ({"calibration": "nope"}, r"frontier\.calibration: unknown calibration set"),
        ({"rows": [{"selection": "rcpu", "compensation": "nope"}]}, r"frontier\.rows\[0\]\.compensation"),
        ({"types": ["q3_k"]}, r"frontier"),
        ({"dense_types": ["q2_k_s"]}, r"frontier"),
    ],
)
def test_bad_frontier_config_is_one_line_naming_the_key(config, change, match):
    raw = yaml.safe_load((REPO / "config.yaml").read_text())
    raw["frontier"].update(change)
    with pytest.raises(ConfigError, match=match) as e:
        frontier_cells(validate_config(raw))
    assert "\n" not in str(e.value)


def _write(path: str, obj) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(obj) if not isinstance(obj, bytes) else "")


def test_table_joins_sizes_perplexities_speeds_and_marks_the_front(config, tmp_path, monkeypatch):
    """Synthetic per-file results in a results/ tree: each row's columns come from its own files,
    an aligned cell reports its realised ratio, a missing file is a status, not a crash."""
    monkeypatch.chdir(tmp_path)
    cfg = copy.deepcopy(config)
    cfg["frontier"].update(
        types=["q8_0", "q4_0"],
        dense_types=["q2_k"],  # the dense model's alone
        ratios=[0.3],
        rows=[{"label": "A", "selection": "rcpu-a256", "compensation": "coec"}],
    )
    spec = frontier_spec(cfg)
    sizes = {("dense", "q8_0"): 4000, ("dense", "q4_0"): 2000, ("A 0.3", "q8_0"): 3000, ("A 0.3", "q4_0"): 1500}
    ppls = {("dense", "q8_0"): 10.0, ("dense", "q4_0"): 11.0, ("A 0.3", "q8_0"): 14.0, ("A 0.3", "q4_0"): 10.5}
    sizes[("dense", "q2_k")], ppls[("dense", "q2_k")] = 1400, 16.0
    speed = []
    for c in spec["cells"]:
        _write(f"{c['folder']}/ppl.json", {"ppl": 9.5 if c["label"] == "dense" else 13.0})
        if c["keep"]:
            _write(c["keep"], {"realised_channel_ratio": 1 / 3})
        for g in c["types"]:
            if (c["label"], g) == ("A 0.3", "q4_0"):
                Path(paths.gguf_file(c["folder"], g)).write_bytes(b"x" * sizes[c["label"], g])
                continue  # no perplexity yet
            Path(c["folder"]).mkdir(parents=True, exist_ok=True)
            Path(paths.gguf_file(c["folder"], g)).write_bytes(b"x" * sizes[c["label"], g])
            _write(paths.gguf_ppl_file(c["folder"], g), {"ppl": ppls[c["label"], g]})
            _write(paths.gguf_report_file(c["folder"], g), {"fallbacks": [{"tensor": "t"}] * (2 if g == "q8_0" else 0)})
            speed.append({"cell": c["label"], "type": g, "decode_tok_s": 100.0, "prefill_tok_s": 500.0, "status": "ok"})
    Path(spec["speed"]).parent.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(speed).to_csv(spec["speed"], index=False)
    Path(spec["speed"]).with_suffix(".md").write_text("Speed caption: load 0.5.\n\n| a |\n")
    df = write_frontier(spec, tmp_path / "results/frontier.csv")
    assert list(zip(df["cell"], df["type"], strict=True)) == [
        ("dense", "q8_0"), ("dense", "q4_0"), ("dense", "q2_k"), ("A 0.3", "q8_0"), ("A 0.3", "q4_0")
    ]  # fmt: skip
    row = df.set_index(["cell", "type"])
    assert row.loc[("dense", "q4_0"), "file_mib"] == pytest.approx(2000 / 2**20)
    assert row.loc[("A 0.3", "q8_0"), "realised_ratio"] == pytest.approx(1 / 3)
    assert row.loc[("dense", "q8_0"), "realised_ratio"] == 0 and row.loc[("A 0.3", "q8_0"), "ppl_fp32"] == 13.0
    assert row.loc[("dense", "q8_0"), "fallbacks"] == 2
    # the dense q4_0 (2000, 11), q8_0 (4000, 10) and q2_k (1400, 16) are on the front; A q8_0 (3000, 14) is not
    assert list(df["pareto"]) == [True, True, True, False, False]
    missing = row.loc[("A 0.3", "q4_0")]
    assert math.isnan(missing["ppl"]) and missing["status"] == "missing ppl, speed"
    md = (tmp_path / "results/frontier.md").read_text()
    assert "Speed caption: load 0.5." in md and "| dense | q4_0 |" in md
    assert Path(spec["figure"]).is_file()
