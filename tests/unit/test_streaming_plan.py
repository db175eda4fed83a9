"""The streamed path's memory plan (coec.workflow.plan): its terms by hand, how it grows, its
fit to the peaks measured on this machine, and paper.yaml's resources, which must be the plan's."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from coec.model.arch.published import PUBLISHED_ARCHS
from coec.workflow import plan

REPO = Path(__file__).resolve().parents[2]
PAPER = REPO / "workflow" / "configs" / "paper.yaml"
MEASURED = sorted((REPO / "benchmarks" / "results").glob("stream_memory_*_cpu.json"))
GIB = 2**30

SETTINGS = dict(
    dtype="bfloat16",
    gram_dtype="float32",
    nsamples=128,
    seqlen=2048,
    batch=8,
    ratio=0.3,
    ppl_tokens=0.35e6,
    ppl_seqlen=4096,
    ppl_batch=1,
    zs_tokens=5e6,
    zs_max_length=4096,
    zs_batch=16,
    budget_gib=16,
    block=1,
)


def test_calibration_terms_by_hand():
    """Llama-3.1-8B, 128 x 2048 tokens in bf16, float32 Grams, on the CPU: the peak is the layer
    phase, layer weights + hidden states + float64 accumulators + batch work; the float32 copies
    are made after the layer is dropped (accumulators + copies: a smaller phase)."""
    arch = PUBLISHED_ARCHS["Llama-3.1-8B"]
    layer = 4096 * 4096 * 2 + 2 * 4096 * 1024 + 3 * 4096 * 14336 + 2 * 4096
    grams = 4096**2 + 14336**2
    work = 8 * 2048 * (3 * 14336 + 2 * 4096) * 4 + 8 * 2048 * 14336 * 4 + 1024 * 14336 * 4
    assert grams * 12 < layer * 2 + grams * 8 + work
    want = layer * 2 + 128 * 2048 * 4096 * 2 + grams * 8 + work
    got = plan.stage_memory(arch, "calibrate", SETTINGS)["host_gib"] - plan.BASELINE_GIB["calibrate"]
    assert got == pytest.approx(want / GIB, rel=1e-12)


def test_plan_grows_with_width_and_tokens_and_stops_at_the_budget():
    arch = dict(PUBLISHED_ARCHS["Llama-3.1-8B"])
    base = plan.stage_memory(arch, "calibrate", SETTINGS)["host_gib"]
    wider = plan.stage_memory({**arch, "intermediate_size": 2 * 14336}, "calibrate", SETTINGS)["host_gib"]
    more = plan.stage_memory(arch, "calibrate", {**SETTINGS, "nsamples": 256})["host_gib"]
    capped = plan.stage_memory(arch, "calibrate", {**SETTINGS, "nsamples": 4096, "budget_gib": 4})
    assert wider > base and more - base == pytest.approx(128 * 2048 * 4096 * 2 / GIB)
    assert capped["host_gib"] < plan.stage_memory(arch, "calibrate", {**SETTINGS, "nsamples": 4096})["host_gib"]
    for st in ("ppl", "zeroshot"):
        small = plan.stage_memory(arch, st, {**SETTINGS, "budget_gib": 1})["host_gib"]
        assert small < plan.stage_memory(arch, st, SETTINGS)["host_gib"]
        assert plan.stage_seconds(arch, st, {**SETTINGS, "budget_gib": 1}) > plan.stage_seconds(arch, st, SETTINGS)


def test_gpu_plan_splits_host_and_device():
    arch = PUBLISHED_ARCHS["Llama-3-70B"]
    cpu = plan.stage_memory(arch, "calibrate", SETTINGS)
    gpu = plan.stage_memory(arch, "calibrate", SETTINGS, gpu=True)
    assert gpu["device_gib"] > 8 and gpu["host_gib"] < cpu["host_gib"] < 40
    with pytest.raises(ValueError, match="exceeds"):
        plan.slurm_resources(arch, "zeroshot", {**SETTINGS, "zs_batch": 4096})


@pytest.mark.skipif(not MEASURED, reason="no recorded stream_memory_*_cpu.json")
@pytest.mark.parametrize("path", MEASURED, ids=lambda p: p.stem)
def test_plan_fits_the_measured_peaks(path):
    """Every stage's measured peak RSS (a streamed run on this machine's CPU) is within 25 %
    (or 0.25 GiB) of the plan for that model and those settings (the compensation method's
    among them: a ridge job factors the Gram, a COEC job decomposes it)."""
    rec = json.loads(path.read_text())
    for row in rec["rows"]:
        stage = row.get("stage", row["label"])  # a row may name its stage and its own settings
        if stage not in plan.BASELINE_GIB:
            continue
        settings = {**rec["settings"], **row.get("settings", {})}
        planned = plan.stage_memory(rec["config"], stage, settings)["host_gib"]
        measured = row["peak"] / GIB
        assert abs(planned - measured) <= max(0.25 * measured, 0.25), (row["label"], planned, measured)


def test_paper_yaml_resources_are_the_plan():
    """Every model of paper.yaml asks SLURM for what the plan gives (one GPU everywhere), and
    none spreads itself over GPUs with a device_map (which would load it whole)."""
    cfg = yaml.safe_load(PAPER.read_text())
    planned = plan.paper_resources(cfg)
    assert set(planned) == set(cfg["models"])
    for model, rules in planned.items():
        got = {rule: cfg["models"][model]["resources"][rule] for rule in rules}
        assert got == rules, model
        assert "device_map" not in cfg["models"][model]
    streamed = {rule: r for rule, r in planned["llama-3-70b"].items() if rule != "export"}
    assert all(r["gpu"] == 1 and r["mem_mb"] <= 32 * 1024 for r in streamed.values())
    assert planned["llama-3-70b"]["export"]["gpu"] == 0  # coec export loads the model, on the CPU


def test_gram_sizes_and_eigh_solve_match_meta_shapes():
    """Gram sizes follow the meta-device module shapes; 8B / 70B figures as in docs/benchmarks.md
    (Memory plan); one down_proj's eigh solve (coec) of a 70B model fits one GPU with room."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    spec = dict(PUBLISHED_ARCHS["Llama-3.1-8B"])
    fam = spec.pop("model_type")
    cfg = AutoConfig.for_model(fam, **dict(spec, num_hidden_layers=1))
    with torch.device("meta"):
        m = AutoModelForCausalLM.from_config(cfg)
    layer = m.model.layers[0]
    d_o, d_ff = layer.self_attn.o_proj.in_features, layer.mlp.down_proj.in_features
    grams = plan.gram_file_bytes(PUBLISHED_ARCHS["Llama-3.1-8B"])
    assert grams["layer"] == (d_o**2 + d_ff**2) * 4
    assert round(grams["layer"] / GIB, 3) == 0.828 and round(grams["total"] / GIB, 1) == 26.5
    big = plan.gram_file_bytes(PUBLISHED_ARCHS["Llama-3-70B"])
    assert round(big["layer"] / GIB, 2) == 3.31 and round(big["total"] / GIB) == 265
    assert round(big["total_sym"] / GIB) == 133
    solve = plan.eigh_solve_bytes(plan.arch_parts(PUBLISHED_ARCHS["Llama-3-70B"]), 0.3)
    assert 15 < solve / GIB < 40
    assert solve < plan.GPU_MEMORY_GIB * GIB
