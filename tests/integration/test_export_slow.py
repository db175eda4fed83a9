"""The slow tests of test_export.py (a real embedded model, a Snakemake run of the whole chain or
several reruns): set slow for the whole file (CI's slow steps, or `pytest -m slow`)."""

from __future__ import annotations

import json

import pytest
import torch

from coec.model.cell import build_model
from conftest import snakemake
from test_export import _export_workflow, cell, logits, reload_plain  # noqa: F401  (helpers and fixtures)

pytestmark = pytest.mark.slow


def test_workflow_export_reloads_with_equal_logits(tmp_path):
    cfg, target = _export_workflow(tmp_path)
    res = snakemake(tmp_path, "--cores", "2", target, "--configfile", str(cfg), check=False)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    out = tmp_path / target
    cell_dir = out.parent.parent
    reloaded = reload_plain(out)
    assert type(reloaded).__name__ == "SeedOssForCausalLM"  # 6 heads + FLAP biases
    assert reloaded.config.num_attention_heads == 6
    cell, _ = build_model(
        str(tmp_path / "tiny-wide"),
        "float32",
        "cpu",
        str(cell_dir / "keep.json"),
        sorted(str(p) for p in (cell_dir / "bias").glob("block*.safetensors")),
    )
    torch.testing.assert_close(logits(reloaded), logits(cell), rtol=0, atol=1e-5)
    saved = json.loads((out / "config.json").read_text())["coec_export"]
    assert saved["cell"] == {"model": "tiny", "calib": "c8", "select": "flap", "ratio": "0.25", "comp": "bias"}
