"""The width search's stages on a tiny Llama (docs/search.md): each layer's candidates (the full
level is the dense layer, every other level the selection's keep set refit by the method), the
fitness (0 for the dense allocation; a candidate allocation is the pruned model's function), a
search deterministic under its seed whose keep.json holds per-layer widths within the budget
band, AL-AM over the same levels, and the refusals (one line, nothing written)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from coec import cli
from coec.calibrate.options import CalibrateOptions, CalibrationWindows
from coec.calibrate.stage import run_calibrate
from coec.data import text as data
from coec.io import artifacts
from coec.model.arch import attention_shape
from coec.model.load import layer_tensor_names, load_config, load_model, read_model_tensors
from coec.model.prune import install_weights_, prune_model_
from coec.model.source import CellSource
from coec.select.scores import KeepRule
from coec.select.search.budget import build_space
from coec.select.search.candidates import LayerCandidateFile
from coec.select.search.fitness import CandidateModel, KLFitness

SPEC = {"method": "coec", "alpha": 0.9, "max_rounds": 3, "o_proj": {"align_lambda": 50.0, "anchor_rank": 4}}
MULTIPLE = 8


@pytest.fixture(scope="module")
def grams(llama_dir, text_dataset, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("search") / "grams"
    run_calibrate(
        CellSource(str(llama_dir), "float32", "cpu"),
        CalibrateOptions(CalibrationWindows(text_dataset, 4, 32, 0, 2), "float64"),
        str(out),
    )
    return out


def candidates_argv(llama_dir, grams, out: Path, layer: int, multiple: int = MULTIPLE) -> list[str]:
    return [
        "search", "candidates", "--model", str(llama_dir), "--grams", str(grams), "--method", "obs",
        "--options", '{"batch": 4}', "--channel-multiple", str(multiple), "--spec", json.dumps(SPEC),
        "--layer", str(layer), "--device", "cpu", "--cell", '{"select": "obs-a8", "comp": "coec"}', "--out", str(out),
    ]  # fmt: skip


@pytest.fixture(scope="module")
def candidates(llama_dir, grams, tmp_path_factory) -> list[Path]:
    folder = tmp_path_factory.mktemp("candidates")
    files = [folder / f"layer{i}.safetensors" for i in range(2)]
    for i, f in enumerate(files):
        assert cli.main(candidates_argv(llama_dir, grams, f, i)) == 0
    return files


def holdout(text_dataset) -> dict:
    dataset = dict(text_dataset, exclude_windows={"nsamples": 4, "seqlen": 32, "seed": 0})
    return {"dataset": dataset, "nsamples": 4, "seqlen": 32, "seed": 1}


def run_argv(llama_dir, candidates, text_dataset, out: Path, *extra: str) -> list[str]:
    return [
        "search", "run", "--model", str(llama_dir), "--name", "search-obs",
        "--candidates", *map(str, candidates), "--holdout", json.dumps(holdout(text_dataset)),
        "--ratio", "0.5", "--channel-multiple", str(MULTIPLE), "--generations", "4", "--offspring", "6",
        "--survivors", "[2, 1]", "--tokens", "[40, 96]", "--device", "cpu",
        "--out", str(out / "keep.json"), "--record", str(out / "search.json"), *extra,
    ]  # fmt: skip


def test_candidates_hold_every_level_and_the_dense_layer(llama_dir, candidates):
    cfg = load_config(llama_dir)
    geom = attention_shape(cfg)
    for i, path in enumerate(candidates):
        f = LayerCandidateFile(path)
        assert f.levels == {"kv_groups": (1, 2), "channels": (8, 16, 24, 32, 40, 48)}
        names = layer_tensor_names(i, cfg)
        w = read_model_tensors(llama_dir, [names["o_proj"], names["down_proj"]])
        for kind, module, width in (("kv_groups", "o_proj", geom.n_kv), ("channels", "down_proj", 48)):
            weight, bias = f.tensors(kind, width)
            assert torch.equal(weight, w[names[module]]) and bias is None  # the full level: the dense layer
            assert f.kept[kind][width] == list(range(width))
            for level in f.levels[kind][:-1]:
                kept = f.kept[kind][level]
                assert len(kept) == level and kept == sorted(set(kept))
                weight, _ = f.tensors(kind, level)
                assert weight.shape[1] == (level * geom.groups * geom.head_dim if kind == "kv_groups" else level)
        info = artifacts.read_json(path.with_suffix(".json"), "search-candidates-info")
        assert info["selection"] == "obs" and info["score_options"] == {"batch": 4, "damp": 0.01}
        assert info["compensation"] == SPEC and info["cell"] == {"select": "obs-a8", "comp": "coec"}
        relerr = [e["relerr_after"] for e in info["levels"]["channels"]]
        assert relerr[-1] == 0.0 and all(0 <= r < 1 for r in relerr)


def test_fitness_is_zero_at_the_dense_allocation_and_the_pruned_model_elsewhere(llama_dir, candidates, text_dataset):
    model, tok = load_model(str(llama_dir), "float32", "cpu")
    cfg = load_config(llama_dir)
    files = [LayerCandidateFile(p) for p in candidates]
    cm = CandidateModel(model, attention_shape(cfg), files)
    h = holdout(text_dataset)
    windows = data.calibration_ids(tok, h["dataset"], h["nsamples"], h["seqlen"], h["seed"])
    fitness = KLFitness(cm, windows)
    assert fitness(cm.dense, 50) == 0.0 and fitness(cm.dense, 96) == 0.0
    levels = (1, 16, 2, 8)
    assert fitness(levels, 50) > 0
    pairs = [(1, 16), (2, 8)]
    keep = {"layers": [{"kv_groups": f.kept["kv_groups"][k], "channels": f.kept["channels"][c]}
                       for f, (k, c) in zip(files, pairs)]}  # fmt: skip
    pruned, _ = load_model(str(llama_dir), "float32", "cpu")
    prune_model_(pruned, keep)
    blocks = {}
    for layer, (kind, level) in enumerate([("kv_groups", 1), ("kv_groups", 2)]):
        blocks[f"layer{layer}.o_proj.weight"] = files[layer].tensors(kind, level)[0]
    for layer, level in enumerate((16, 8)):
        weight, bias = files[layer].tensors("channels", level)
        blocks[f"layer{layer}.down_proj.weight"] = weight
        if bias is not None:
            blocks[f"layer{layer}.down_proj.bias"] = bias
    install_weights_(pruned, blocks)
    with torch.no_grad():
        want = pruned(windows[:1]).logits[0]
    cm.set_levels(levels)
    torch.testing.assert_close(cm.logits(windows[0]), want, rtol=1e-4, atol=1e-5)


def test_search_is_deterministic_and_within_the_budget(llama_dir, candidates, text_dataset, tmp_path):
    outs = [tmp_path / "a", tmp_path / "b"]
    for out in outs:
        out.mkdir()
        assert cli.main(run_argv(llama_dir, candidates, text_dataset, out)) == 0
    for name in ("keep.json", "search.json"):
        assert (outs[0] / name).read_bytes() == (outs[1] / name).read_bytes()
    keep = artifacts.read_keep(outs[0] / "keep.json", 2)
    record = artifacts.read_json(outs[0] / "search.json", "search")
    assert keep["selection"] == "search-obs" and keep["search"] == {
        "candidates": "obs-a8",
        "compensation": "coec",
        "allocation": "evolve",
    }
    space = build_space(load_config(llama_dir), KeepRule(0.5, "ceil", "ceil", MULTIPLE))
    widths = [{"kv_groups": len(k["kv_groups"]), "channels": len(k["channels"])} for k in keep["layers"]]
    assert widths == record["widths"]
    state = space.state_of([w[kind] for w in widths for kind in ("kv_groups", "channels")])
    lo, hi = record["budget"]["band"]
    assert lo <= space.cost(state) == record["cost"] <= hi == space.budget
    assert lo >= (1 - 0.005) * space.budget
    assert [g["generation"] for g in record["curve"]] == [0, 1, 2, 3]
    best = [g["best"] for g in record["curve"]]
    assert best == sorted(best, reverse=True) and record["fitness"] == best[-1] <= record["uniform"]["fitness"]
    assert record["options"]["tokens"] == [40, 96] and record["fitness_tokens"] == 96


def test_alam_allocation_over_the_same_levels(llama_dir, candidates, grams, text_dataset, tmp_path):
    argv = run_argv(llama_dir, candidates, text_dataset, tmp_path, "--allocation", "alam", "--grams", str(grams))
    assert cli.main(argv) == 0
    record = artifacts.read_json(tmp_path / "search.json", "search")
    assert record["allocation"] == "alam" and record["curve"] == []
    assert record["cost"] <= record["budget"]["amount"] and record["fitness"] >= 0


@pytest.mark.parametrize(
    "extra, message",
    [
        (("--budget", '{"params": 1}'), "selections.search-obs.budget.params: 1 params cannot be met"),
        (("--channel-multiple", "16"), "channel_multiple 16 needs layer 0's"),
        (("--tokens", "[40, 1000]"), "1000 fitness tokens, but the held-out windows hold 128"),
        (("--survivors", "[1, 2]"), "selections.search-obs.survivors must not increase"),
    ],
)
def test_search_refusals_write_nothing(llama_dir, candidates, text_dataset, tmp_path, capsys, extra, message):
    assert cli.main(run_argv(llama_dir, candidates, text_dataset, tmp_path, *extra)) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert message in err, err
    assert not list(tmp_path.iterdir())


def test_blend_candidates_blend_their_base_candidates_on_the_holdout_grams(
    llama_dir, grams, candidates, text_dataset, tmp_path, capsys
):
    """blend's candidates: the same keep sets as their base's (coec's) candidates, each refit
    blended from the base's refit at that level and ridge on the held-out Grams; without the
    base's candidates, or with another layer's, refused in one line with nothing written."""
    hold = tmp_path / "holdout-grams"
    run_calibrate(
        CellSource(str(llama_dir), "float32", "cpu"),
        CalibrateOptions(CalibrationWindows(text_dataset, 4, 32, 1, 2), "float64"),
        str(hold),
    )
    out = tmp_path / "blend" / "layer0.safetensors"
    out.parent.mkdir()
    blend = {"method": "blend", "base": "coec", "holdout": "h"}

    def argv(inputs: dict, layer: int = 0) -> list[str]:
        a = candidates_argv(llama_dir, grams, out, layer)
        a[a.index("--spec") + 1] = json.dumps({**blend, "inputs": inputs})
        return a

    assert cli.main(argv({"holdout": str(hold)})) == 2
    assert "blend candidates need 'base'" in capsys.readouterr().err and not list(out.parent.iterdir())
    assert cli.main(argv({"base": str(candidates[1]), "holdout": str(hold)})) == 2
    assert "holds layer 1's candidates, not 0's" in capsys.readouterr().err and not list(out.parent.iterdir())

    assert cli.main(argv({"base": str(candidates[0]), "holdout": str(hold)})) == 0
    got, base = LayerCandidateFile(out), LayerCandidateFile(candidates[0])
    assert got.kept == base.kept and got.levels == base.levels
    moved = 0
    for kind in ("kv_groups", "channels"):
        full = got.levels[kind][-1]
        assert torch.equal(got.tensors(kind, full)[0], base.tensors(kind, full)[0])  # the dense layer
        for level in got.levels[kind][:-1]:
            weight, _ = got.tensors(kind, level)
            assert weight.shape == base.tensors(kind, level)[0].shape and torch.isfinite(weight).all()
            moved += not torch.equal(weight, base.tensors(kind, level)[0])
    assert moved  # blended (beta > 0 or an intercept) somewhere, not the base's refit copied


def test_candidates_refuse_a_multiple_above_the_mlp_width(llama_dir, grams, tmp_path, capsys):
    out = tmp_path / "layer0.safetensors"
    assert cli.main(candidates_argv(llama_dir, grams, out, 0, multiple=64)) == 2
    assert "channel_multiple 64 is larger than the MLP width d_ff = 48" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())
