"""The slow tests of test_arch.py (a real embedded model, a Snakemake run of the whole chain or
several reruns): set slow for the whole file (CI's slow steps, or `pytest -m slow`)."""

from __future__ import annotations

import json

import pytest
import torch

from coec.calibrate.options import CalibrateOptions, CalibrationWindows
from coec.compensate.stage import CompensateOptions
from coec.evaluate.options import PplOptions
from coec.model.arch import MODULES
from coec.model.source import CellSource
from coec.select.options import SelectOptions
from conftest import make_model_dir
from test_arch import _masked_logits  # noqa: F401  (helpers and fixtures)

pytestmark = pytest.mark.slow


def test_granite_end_to_end(tmp_path, text_dataset):
    """Granite through the workflow's stages: calibrate -> select -> compensate (none, coec) ->
    perplexity in memory -> export into the stock Granite class with equal logits."""
    from transformers import AutoModelForCausalLM

    from coec.calibrate.stage import run_calibrate
    from coec.compensate.stage import run_compensate
    from coec.evaluate.stage import run_ppl
    from coec.export.hf_class import build_export_model
    from coec.model.cell import build_model
    from coec.select.stage import run_select

    src = make_model_dir(tmp_path / "granite", "granite", attention_bias=True)
    grams, keep_path = tmp_path / "grams", tmp_path / "keep.json"
    run_calibrate(
        CellSource(str(src), "float64", "cpu"),
        CalibrateOptions(CalibrationWindows(text_dataset, 8, 32, 0, 4), "float64"),
        str(grams),
    )
    keep = run_select(CellSource(str(src)), str(grams), SelectOptions("wanda_sp", 0.5, "ceil"), str(keep_path))
    assert all(len(k["kv_groups"]) == 1 for k in keep["layers"])
    none_file, coec_file = tmp_path / "none.safetensors", tmp_path / "coec.safetensors"
    run_compensate(
        CellSource(str(src), keep=str(keep_path), device="cpu"),
        str(grams),
        CompensateOptions({"method": "none"}, 0, 1),
        str(none_file),
    )
    run_compensate(
        CellSource(str(src), keep=str(keep_path), device="cpu"),
        str(grams),
        CompensateOptions({"method": "coec", "alpha": 0.9, "max_rounds": 2}, 0, 1),
        str(coec_file),
    )

    ids = torch.randint(0, 320, (2, 20), generator=torch.Generator().manual_seed(3))
    pruned, _ = build_model(str(src), "float64", "cpu", str(keep_path), [str(none_file)])
    with torch.no_grad():
        torch.testing.assert_close(pruned(input_ids=ids).logits, _masked_logits(src, keep, ids), rtol=1e-9, atol=1e-9)

    comp, _ = build_model(str(src), "float64", "cpu", str(keep_path), [str(coec_file)])
    a, b = pruned.state_dict(), comp.state_dict()
    changed = {n for n in a if not torch.equal(a[n], b[n])}
    assert changed and all(n.split(".")[-2] in MODULES for n in changed), changed

    source = CellSource(str(src), "float64", "cpu", keep=str(keep_path), comp=(str(coec_file),))
    res = run_ppl(source, PplOptions(text_dataset, 32, 4, 2), str(tmp_path / "ppl.json"))
    assert res["ppl"] > 1 and res["params"] == sum(p.numel() for p in comp.parameters())

    target, info = build_export_model(comp)
    assert info["model_type"] == "granite" and info["max_abs_logit_diff"] < 1e-8
    target.save_pretrained(tmp_path / "out")
    saved = json.loads((tmp_path / "out" / "config.json").read_text())
    assert saved["embedding_multiplier"] == 4.0 and saved["num_key_value_heads"] == 1
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path / "out", dtype=torch.float64)
    with torch.no_grad():
        torch.testing.assert_close(reloaded(input_ids=ids).logits, comp(input_ids=ids).logits, rtol=1e-9, atol=1e-9)
