"""Aligned MLP widths on a tiny Llama (d_ff 48) through the select stage: keep.json byte for byte
as before at the paper's rule, the rule and realised ratios recorded otherwise, the refusal of a
multiple above the width, and every compensation method on an aligned keep set."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from coec import cli
from coec.calibrate.options import CalibrateOptions, CalibrationWindows
from coec.calibrate.stage import run_calibrate
from coec.io import artifacts
from coec.io.provenance import model_provenance
from coec.model.arch import MODULES, attention_shape, o_proj_columns
from coec.model.cell import build_model
from coec.model.load import layer_tensor_names, load_config, read_model_tensors
from coec.model.source import CellSource
from coec.select.scores import layer_scores, n_keep, top_k_sorted
from conftest import method_kwargs

RATIO = 0.3  # 33.6 of 48 channels: 34 by the paper's rule


@pytest.fixture(scope="module")
def grams(llama_dir, text_dataset, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("widths") / "grams"
    run_calibrate(
        CellSource(str(llama_dir), "float32", "cpu"),
        CalibrateOptions(CalibrationWindows(text_dataset, 4, 32, 0, 2), "float32"),
        str(out),
    )
    return out


def _select(llama_dir, grams, out, *extra) -> int:
    argv = ["select", "--model", str(llama_dir), "--grams", str(grams), "--method", "rcpu"]
    return cli.main([*argv, "--ratio", str(RATIO), "--group-rounding", "nearest", *extra, "--out", str(out)])


def _old_keep_text(llama_dir, grams) -> str:
    """keep.json as the select stage wrote it before aligned widths existed."""
    cfg = load_config(llama_dir)
    geom = attention_shape(cfg)
    layers = []
    for i in range(cfg.num_hidden_layers):
        names = layer_tensor_names(i, cfg)
        w = read_model_tensors(llama_dir, [names["o_proj"], names["down_proj"]])
        st = {m: artifacts.read_gram_layer(grams, i, m) for m in MODULES}
        sc = layer_scores("rcpu", {m: w[names[m]] for m in MODULES}, st, geom)
        k = math.ceil((1.0 - RATIO) * cfg.intermediate_size - 1e-9)
        layers.append(
            {
                "kv_groups": top_k_sorted(sc["groups"], n_keep(geom.n_kv, RATIO, "nearest")),
                "channels": top_k_sorted(sc["down_proj"], k),
            }
        )
    keep = {
        "selection": "rcpu",
        "ratio": RATIO,
        "group_rounding": "nearest",
        "n_kv": geom.n_kv,
        "n_heads": geom.n_heads,
        "head_dim": geom.head_dim,
        "d_ff": cfg.intermediate_size,
        "layers": layers,
        "model": model_provenance(str(llama_dir), None, False, llama_dir),
    }
    return artifacts.json_text(keep, "keep")


def test_paper_rule_keep_json_unchanged(llama_dir, grams, tmp_path):
    assert _select(llama_dir, grams, tmp_path / "default.json") == 0
    one = ("--channel-multiple", "1", "--channel-rounding", "ceil")
    assert _select(llama_dir, grams, tmp_path / "one.json", *one) == 0
    text = (tmp_path / "default.json").read_text()
    assert text == _old_keep_text(llama_dir, grams)
    assert (tmp_path / "one.json").read_bytes() == text.encode()
    assert "channel_multiple" not in text and "realised" not in text
    assert all(len(k["channels"]) == 34 for k in artifacts.read_keep(tmp_path / "default.json")["layers"])


def test_aligned_keep_json_records_rule_and_realised_ratios(llama_dir, grams, tmp_path, caplog):
    out = tmp_path / "keep.json"
    assert _select(llama_dir, grams, out, "--channel-multiple", "16", "--channel-rounding", "floor") == 0
    keep = artifacts.read_keep(out, 2)
    assert (keep["channel_multiple"], keep["channel_rounding"]) == (16, "floor")
    assert keep["realised_channel_ratio"] == 16 / 48
    paper = artifacts.read_keep(_old_path(llama_dir, grams, tmp_path), 2)
    for k, p in zip(keep["layers"], paper["layers"]):
        assert len(k["channels"]) == 32 and k["realised_channel_ratio"] == 16 / 48
        assert set(k["channels"]) <= set(p["channels"])  # the top 32 of the same score
        assert k["kv_groups"] == p["kv_groups"]  # whole KV groups, as before
    # ceil at 16: 33.6 -> 48, every channel (logged), still a valid keep set
    assert _select(llama_dir, grams, tmp_path / "all.json", "--channel-multiple", "16") == 0
    assert artifacts.read_keep(tmp_path / "all.json")["realised_channel_ratio"] == 0.0
    assert "channel_multiple 16 (ceil) keeps all 48 MLP channels at ratio 0.3" in caplog.text
    assert (
        _select(llama_dir, grams, tmp_path / "zero.json", "--channel-multiple", "48", "--channel-rounding", "floor")
        == 0
    )
    assert "rounds (1 - 0.3) x 48 channels to 0: keeping one multiple, 48 channels" in caplog.text


def _old_path(llama_dir, grams, tmp_path) -> Path:
    path = tmp_path / "paper.json"
    path.write_text(_old_keep_text(llama_dir, grams))
    return path


def test_multiple_above_the_width_is_refused(llama_dir, grams, tmp_path, capsys):
    out = tmp_path / "keep.json"
    assert _select(llama_dir, grams, out, "--channel-multiple", "64") == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("coec select: error")]
    assert err == ["coec select: error: channel_multiple 64 is larger than the MLP width d_ff = 48"]
    assert not out.exists() and not list(tmp_path.iterdir())


@pytest.mark.parametrize("method", ["none", "bias", "lstsq", "rcpu", "coec", "blend"])
def test_every_method_compensates_an_aligned_keep_set(llama_dir, grams, tmp_path, method):
    from coec.compensate import compensate
    from coec.model.load import load_model
    from coec.model.prune import install_weights_, prune_model_

    out = tmp_path / "keep.json"
    assert _select(llama_dir, grams, out, "--channel-multiple", "8", "--channel-rounding", "nearest") == 0
    keep = artifacts.read_keep(out, 2)
    cfg = load_config(llama_dir)
    geom = attention_shape(cfg)
    tensors = {}
    for i, k in enumerate(keep["layers"]):
        assert len(k["channels"]) == 32  # 33.6 -> 4 x 8
        names = layer_tensor_names(i, cfg)
        w = read_model_tensors(llama_dir, [names["o_proj"], names["down_proj"]])
        for module, cols in (("o_proj", o_proj_columns(k["kv_groups"], geom)), ("down_proj", k["channels"])):
            st = artifacts.read_gram_layer(grams, i, module)
            W0 = w[names[module]].double()
            kw = method_kwargs(method, W0, st["gram"].double(), st["mean"].double(), cols, st["count"])
            res = compensate(W0, st["gram"].double(), st["mean"].double(), cols, method, **kw)
            assert res.weight.shape == (W0.shape[0], len(cols)) and torch.isfinite(res.weight).all()
            tensors[f"layer{i}.{module}.weight"] = res.weight.float()
            if res.bias is not None:
                tensors[f"layer{i}.{module}.bias"] = res.bias.float()
    model, _ = load_model(str(llama_dir), dtype="float32", device="cpu")
    prune_model_(model, keep)
    install_weights_(model, tensors)
    assert model.config.intermediate_size == 32
    with torch.no_grad():
        logits = model(torch.arange(1, 17)[None]).logits
    assert logits.shape == (1, 16, cfg.vocab_size) and torch.isfinite(logits).all()


def test_measured_table_reads_the_realised_widths(llama_dir, grams, tmp_path):
    """The measured table's bounds and sizes come from the exported GGUF file (coec.report.measured.bounds),
    so an aligned cell is counted at its realised width; its MLP rows quantize (q8_0, block 32)
    where the paper's 34 channels fall back to f16."""
    from coec.export.gguf import write_gguf
    from coec.report.measured.bounds import gguf_flops_per_token, gguf_read_bytes

    paper, aligned = tmp_path / "paper.json", tmp_path / "a32.json"
    assert _select(llama_dir, grams, paper) == 0
    assert _select(llama_dir, grams, aligned, "--channel-multiple", "32", "--channel-rounding", "nearest") == 0
    reports, files = {}, {}
    for keep in (paper, aligned):
        model, tok = build_model(str(llama_dir), "float32", "cpu", str(keep), [])
        files[keep] = tmp_path / f"{keep.stem}.gguf"
        reports[keep] = write_gguf(model, tok, files[keep], "q8_0")
    assert reports[paper]["ffn"] == [34, 34] and reports[aligned]["ffn"] == [32, 32]
    ffn_fallbacks = {k: [f["tensor"] for f in r["fallbacks"] if ".ffn_" in f["tensor"]] for k, r in reports.items()}
    assert ffn_fallbacks == {paper: ["blk.0.ffn_down.weight", "blk.1.ffn_down.weight"], aligned: []}
    hidden, layers = 32, 2  # 2 channels fewer per layer: their gate, up and down weights
    flops = {k: gguf_flops_per_token(f, 0.0) for k, f in files.items()}
    assert flops[paper] - flops[aligned] == 2.0 * 2 * 3 * hidden * layers
    assert gguf_read_bytes(files[aligned]) < gguf_read_bytes(files[paper])
