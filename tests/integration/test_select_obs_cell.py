"""The obs selection through the select stage on a tiny Llama: keep.json records obs's options and
each layer's predicted error, the kept counts are the rule's, and lstsq on its keep sets (at
obs's λ) reproduces the predicted errors from the Grams."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from coec import cli
from coec.calibrate.options import CalibrateOptions, CalibrationWindows
from coec.calibrate.stage import run_calibrate
from coec.compensate import compensate
from coec.io import artifacts
from coec.model.arch import attention_shape, o_proj_columns
from coec.model.load import layer_tensor_names, load_config, read_model_tensors
from coec.model.source import CellSource
from coec.select.scores import aligned_keep, n_keep


@pytest.fixture(scope="module")
def grams(llama_dir, text_dataset, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("obs") / "grams"
    run_calibrate(
        CellSource(str(llama_dir), "float32", "cpu"),
        CalibrateOptions(CalibrationWindows(text_dataset, 4, 32, 0, 2), "float64"),
        str(out),
    )
    return out


def test_obs_keep_json_and_its_prediction(llama_dir, grams, tmp_path):
    out = tmp_path / "keep.json"
    argv = ["select", "--model", str(llama_dir), "--grams", str(grams), "--method", "obs"]
    argv += ["--options", '{"batch": 4}', "--ratio", "0.3", "--group-rounding", "nearest"]
    assert cli.main([*argv, "--channel-multiple", "8", "--out", str(out)]) == 0
    keep = artifacts.read_keep(out, 2)
    assert keep["selection"] == "obs" and keep["score_options"] == {"batch": 4, "damp": 0.01}
    cfg = load_config(llama_dir)
    geom = attention_shape(cfg)
    for i, k in enumerate(keep["layers"]):
        assert len(k["kv_groups"]) == n_keep(geom.n_kv, 0.3, "nearest")
        assert len(k["channels"]) == aligned_keep(cfg.intermediate_size, 0.3, 8, "ceil")
        names = layer_tensor_names(i, cfg)
        w = read_model_tensors(llama_dir, [names["o_proj"], names["down_proj"]])
        for module, cols in (
            ("o_proj", o_proj_columns(k["kv_groups"], geom)),
            ("down_proj", torch.tensor(k["channels"])),
        ):
            st = artifacts.read_gram_layer(grams, i, module)
            diag = st["gram"].double().diagonal()
            ridge = 0.01 * float(diag.mean() / diag[cols].mean())
            W0 = w[names[module]].double()
            info = compensate(W0, st["gram"], st["mean"], cols, "lstsq", n_tokens=st["count"], ridge=ridge).info
            assert info["relerr_after"] == pytest.approx(k["predicted_relerr"][module], rel=1e-6)
