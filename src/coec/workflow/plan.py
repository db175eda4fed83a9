"""Memory and time plan of the streamed stages, and the SLURM resources it implies.

Pure arithmetic on architecture numbers (``cost.arch_dims``) and stage settings; no I/O. A stage's
peak resident memory is a measured baseline (the interpreter, torch, transformers, lm-eval) plus
what the stage holds at its largest moment (GiB = 2**30 bytes; ``w`` = bytes per compute-dtype
value, ``h`` hidden size, ``d_a`` = heads x head_dim, ``d_ff`` the MLP width, ``V`` vocabulary):

* calibrate: the hidden states of all N x S calibration tokens (``N S h w``, at most
  ``compute.hidden_cache_budget_gb``: the rest go to files) and the largest of: one layer's
  weights with the float64 Gram accumulators of the layer (``8 (d_a^2 + d_ff^2)``), one batch's
  activations and Gram temporaries; the accumulators with their stored copies (``gram_bytes``
  each; the layer is gone by then); the embedding (while the sequences are embedded).
* select: one layer's o_proj / down_proj weights as stored and in float64, and its Gram file.
* compensate: one down_proj's solve and its Gram: for coec (``settings["method"]``, the default)
  :func:`eigh_solve_bytes` (the eigh of the full Gram), for the other methods
  the float64 metric and one more (d_ff, d_ff) buffer (``compensate_solve_bytes``).
* export (not streamed): the whole model in the compute dtype, on the CPU.
* ppl / zeroshot: one group's hidden states (at most the budget), plus the largest of the
  embedding, one layer with a batch's activations, and the head with a batch's float32 logits
  twice over (the loss's or lm-eval's log-softmax copy; the perplexity loss's chunks besides).

On a GPU the layer, the accumulators, activations and logits live on the device; the host holds
the baseline, a CUDA context, the hidden states, the Gram copies and the mapped pages of the part
being copied. :func:`stage_memory` gives both; :data:`BASELINE_GIB` and the fit against the
peaks measured on this machine (CPU) are in ``benchmarks/results/stream_memory_*.txt`` and
tests/unit/test_streaming_plan.py. :func:`slurm_resources` turns a plan into ``gpu``, ``mem_mb`` and
``runtime``; :func:`paper_resources` does so for every model of ``workflow/configs/paper.yaml``
(which holds exactly these numbers: tested).
"""

from __future__ import annotations

import math
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from coec.config.validate import schema_default
from coec.model.arch.published import PUBLISHED_ARCHS
from coec.report.cost import GIB, arch_dims, config_dict, kept_count, param_breakdown
from coec.select.rounding import DEFAULT_ROUNDING

#: Resident memory of a stage's process beside its model data (GiB): python, torch,
#: transformers, the tokenized text (calibrate: the whole calibration split), lm-eval and its
#: task data (zeroshot). Measured on the CPU as the peaks of a 2-layer, 64-wide Llama with
#: SmolLM2's tokenizer on the embedded text (benchmarks/results/stream_memory_tiny_cpu.txt).
BASELINE_GIB = {"calibrate": 0.75, "select": 0.31, "compensate": 0.31, "ppl": 0.52, "zeroshot": 0.72, "export": 0.52}
#: Host memory a CUDA context and its kernels add to a GPU job (GiB; not measured here).
CUDA_CONTEXT_GIB = 2.0
#: Planning constants of the runtime model (an A100/H100-class GPU and a shared file system).
GPU_MEMORY_GIB = 80.0
FORWARD_TFLOPS = 100.0  # bf16 decoder forward; one H200 measured 480 (bench_foundation_h200.txt)
GRAM_TFLOPS = 15.0  # Gram products (float32 accumulation); one H200 measured 29.5
READ_GB_S = 1.0  # checkpoint reads
WRITE_GB_S = 1.0  # Gram writes
COMPENSATE_8B_LAYER_S = 50  # one COEC layer (o_proj + down_proj), Llama-3.1-8B, one H200
#: Tokens of the seven paper tasks' loglikelihood requests, all documents (context + choice,
#: one sequence per shared context), all seven tasks, counted with the SmolLM2 tokenizer on the
#: local data: 4.2e6 (hellaswag 3.18e6, boolq 0.50e6, arc_easy 0.26e6, arc_challenge 0.16e6, ...).
ZEROSHOT_TOKENS = 5.0e6  # 4.2e6 counted; a margin for other tokenizers
#: The longest of those requests: 1,299 tokens (boolq); HFLM pads a batch to its longest.
ZEROSHOT_MAX_TOKENS = 1536


def _w(dtype: str) -> int:
    return {"float32": 4, "fp32": 4, "float64": 8, "bfloat16": 2, "bf16": 2, "float16": 2, "fp16": 2}[dtype]


def arch_parts(config: Any) -> dict[str, int]:
    """Architecture numbers: hidden, d_a, d_ff, vocab, layers, parameters of one layer and of
    the embedding (and of an untied head)."""
    d = arch_dims(config_dict(config))
    p = param_breakdown(d)
    return {
        "h": d["hidden"],
        "da": d["heads"] * d["head_dim"],
        "ff": d["ffn"],
        "V": d["vocab"],
        "L": d["layers"],
        "layer": (p["attention"] + p["mlp"]) // d["layers"] + 2 * d["hidden"],
        "embed": p["embed"],
        "head": p["lm_head"] or p["embed"],
        "params": sum(p.values()),
    }


def calibrate_memory(a: Mapping[str, int], s: Mapping[str, Any], budget: float, gpu: bool) -> tuple[float, float]:
    """(host bytes, device bytes) of a calibration pass at its largest moment (``s``: the
    settings of :func:`stage_memory`)."""
    nsamples, seqlen, batch = s["nsamples"], s["seqlen"], s["batch"]
    w, gram_bytes = _w(s["dtype"]), _w(s.get("gram_dtype", "float32"))
    hidden = min(nsamples * seqlen * a["h"] * w, budget)
    grams = a["da"] ** 2 + a["ff"] ** 2
    toks = batch * seqlen
    work = (
        toks * (3 * a["ff"] + 2 * a["h"]) * 4  # a batch's MLP activations
        + toks * a["ff"] * 4
        + min(1024, a["ff"]) * a["ff"] * 4
    )  # upcast batch, block product
    layer, embed = a["layer"] * w, a["embed"] * w
    if not gpu:  # the layer is dropped before the accumulators are copied for writing
        return hidden + max(embed, layer + grams * 8 + work, grams * (8 + gram_bytes)), 0.0
    return max(embed, layer) + hidden + grams * gram_bytes, layer + grams * 8 + work


def eval_memory(
    a: Mapping[str, int], sizes: tuple[float, int, int], w: int, budget: float, gpu: bool, log_softmax: bool
) -> tuple[float, float]:
    """(host bytes, device bytes) of a layer-sequential evaluation at its largest moment;
    ``sizes``: (tokens, seqlen, batch)."""
    tokens, seqlen, batch = sizes
    group = min(tokens * a["h"] * w, max(budget, batch * seqlen * a["h"] * w))
    toks = batch * seqlen
    act = toks * (3 * a["ff"] + 2 * a["h"]) * 4
    logits = 2 * toks * a["V"] * 4 + (0 if log_softmax else 2 * min(1024, seqlen) * a["V"] * 4)
    layer, embed, head = a["layer"] * w, a["embed"] * w, a["head"] * w
    if not gpu:
        return group + max(embed, layer + act, head + logits), 0.0
    return group + max(embed, layer, head), max(layer + act, head + logits)


#: Methods whose down_proj solve decomposes the whole Gram (coec's tempering ``G^alpha``: an eigh
#: with LAPACK's 2 d_ff^2 workspace); the others factor it by Cholesky at most.
EIGH_METHODS = frozenset({"coec"})


def gram_file_bytes(config: Any, gram_bytes: int = 4) -> dict[str, int]:
    """Bytes of the stored Grams (o_proj input ``d_a^2``, down_proj input ``d_ff^2``, ``gram_bytes``
    each): ``layer`` / ``total`` (all layers) as stored, ``layer_sym`` / ``total_sym`` with one
    triangle only."""
    a = arch_parts(config)
    full = (a["da"] ** 2 + a["ff"] ** 2) * gram_bytes
    sym = (a["da"] * (a["da"] + 1) + a["ff"] * (a["ff"] + 1)) // 2 * gram_bytes
    return {"layer": full, "total": a["L"] * full, "layer_sym": sym, "total_sym": a["L"] * sym}


def eigh_solve_bytes(a: Mapping[str, int], ratio: float) -> float:
    """Bytes of compensating one down_proj by an eigh method (:data:`EIGH_METHODS`): the float64
    eigh of the full Gram (G, eigenvectors, one work copy), the kept (k, k) slice and its tempered
    copy in float32, W0 and W in float32, the kept frame; ``k`` the kept channels at ``ratio``."""
    h, ff = a["h"], a["ff"]
    k = kept_count(ff, ratio, DEFAULT_ROUNDING)
    return float(3 * ff * ff * 8 + 2 * k * k * 4 + 2 * h * ff * 4 + 2 * min(h, k) * k * 4)


def compensate_solve_bytes(a: Mapping[str, int], ratio: float, method: str, gram_bytes: int, gpu: bool) -> float:
    """Bytes of one down_proj solve beside the Gram as read: for an eigh method
    :func:`eigh_solve_bytes`; for the others the float64 metric and one more
    (d_ff, d_ff) buffer (App. B's shifted copy, factored in place; the ridge solve's slices and
    factor are smaller) and W0 in float64. On the CPU the Gram file's mapped pages count too."""
    if method in EIGH_METHODS:
        solve = eigh_solve_bytes(a, ratio)
    else:
        solve = 2 * a["ff"] ** 2 * 8 + a["h"] * a["ff"] * 8
    return solve if gpu else solve + a["ff"] ** 2 * gram_bytes


def stage_memory(config: Any, stage: str, settings: Mapping[str, Any], gpu: bool = False) -> dict[str, float]:
    """``{"host_gib", "device_gib"}`` of a stage (calibrate, select, compensate, ppl, zeroshot).

    ``settings``: ``dtype`` (compute), ``gram_dtype``, ``nsamples``, ``seqlen``, ``batch``
    (calibration), ``ratio``, ``method`` (compensation; default coec), ``ppl_tokens``,
    ``ppl_seqlen``, ``ppl_batch``, ``zs_tokens``, ``zs_max_length``, ``zs_batch``, ``budget_gib``
    (``compute.hidden_cache_budget_gb``)."""
    a, s = arch_parts(config), settings
    w, gb = _w(s["dtype"]), _w(s.get("gram_dtype", "float32"))
    budget = s["budget_gib"] * GIB
    if stage == "calibrate":
        host, dev = calibrate_memory(a, s, budget, gpu)
    elif stage == "select":
        # o_proj and down_proj as stored and as float64 (the scores), both layers' Gram files
        host, dev = (a["h"] * (a["da"] + a["ff"])) * (w + 8) + (a["da"] ** 2 + a["ff"] ** 2) * gb, 0.0
    elif stage == "compensate":
        solve = compensate_solve_bytes(a, s.get("ratio", 0.3), s.get("method", "coec"), gb, gpu)
        gram = a["ff"] ** 2 * gb + 3 * a["h"] * a["ff"] * 4
        host, dev = (gram, solve) if gpu else (gram + solve, 0.0)
    elif stage in ("ppl", "zeroshot"):
        ppl = stage == "ppl"
        sizes = (
            s["ppl_tokens"] if ppl else s["zs_tokens"],
            s["ppl_seqlen"] if ppl else min(s["zs_max_length"], s.get("zs_longest", ZEROSHOT_MAX_TOKENS)),
            s["ppl_batch"] if ppl else s["zs_batch"],
        )
        host, dev = eval_memory(a, sizes, w, budget, gpu, log_softmax=not ppl)
    elif stage == "export":  # loads the whole model (coec export), on the CPU
        host, dev, gpu = a["params"] * w + a["layer"] * w, 0.0, False
    else:
        raise ValueError(f"unknown stage {stage!r}")
    base = BASELINE_GIB[stage] + (CUDA_CONTEXT_GIB if gpu else 0.0)
    return {"host_gib": base + host / GIB, "device_gib": dev / GIB}


def stage_seconds(config: Any, stage: str, settings: Mapping[str, Any]) -> float:
    """Planned seconds of a stage on one GPU: checkpoint reads (once per group of batches),
    forward FLOPs (``2 x params`` per token) at :data:`FORWARD_TFLOPS`, Gram FLOPs (about
    ``1.1 (d_a^2 + d_ff^2)`` per token and layer: the upper block triangle) at
    :data:`GRAM_TFLOPS`, Gram writes, a compensation layer scaled from the measured 8B one by
    ``(d_ff / 14336)^3``."""
    a, s = arch_parts(config), settings
    ckpt = a["params"] * _w(s["dtype"])

    def flops(tokens: float) -> float:
        return 2.0 * a["params"] * tokens

    if stage == "calibrate":
        tokens = s["nsamples"] * s["seqlen"]
        gram_flops = a["L"] * tokens * 1.1 * (a["da"] ** 2 + a["ff"] ** 2)
        writes = a["L"] * (a["da"] ** 2 + a["ff"] ** 2) * _w(s.get("gram_dtype", "float32"))
        seconds: float = (
            ckpt / (READ_GB_S * 1e9)
            + flops(tokens) / (FORWARD_TFLOPS * 1e12)
            + gram_flops / (GRAM_TFLOPS * 1e12)
            + writes / (WRITE_GB_S * 1e9)
        )
        return seconds
    if stage == "select":
        return a["L"] * (a["da"] ** 2 + a["ff"] ** 2) * 4 / (READ_GB_S * 1e9) + 60
    if stage == "compensate":
        return float(s.get("block", 1) * COMPENSATE_8B_LAYER_S * (a["ff"] / 14336) ** 3)
    if stage == "export":
        return 2 * ckpt / (READ_GB_S * 1e9) + 60
    tokens = s["ppl_tokens"] if stage == "ppl" else s["zs_tokens"]
    groups = math.ceil(tokens * a["h"] * _w(s["dtype"]) / (s["budget_gib"] * GIB))
    eval_seconds: float = groups * ckpt / (READ_GB_S * 1e9) + flops(tokens) / (FORWARD_TFLOPS * 1e12)
    return eval_seconds


def round_up(x: float, step: int) -> int:
    return int(math.ceil(x / step) * step)


def slurm_resources(config: Any, stage: str, settings: Mapping[str, Any]) -> dict[str, int]:
    """``{"gpu", "mem_mb", "runtime"}`` of a stage's job: one GPU (the device plan must fit
    :data:`GPU_MEMORY_GIB`), host memory 1.25 x the plan + 2 GiB rounded up to 4 GiB (in MiB),
    runtime 2 x the plan + 10 minutes rounded up to 30 minutes."""
    mem = stage_memory(config, stage, settings, gpu=True)
    if mem["device_gib"] > GPU_MEMORY_GIB:
        raise ValueError(f"{stage}: {mem['device_gib']:.1f} GiB on the device exceeds {GPU_MEMORY_GIB}")
    host = mem["host_gib"]
    if stage == "calibrate" and settings.get("loaded"):  # the iterative stages share these resources
        host = max(host, loaded_calibrate_gib(config, settings))
    minutes = 2 * stage_seconds(config, stage, settings) / 60 + 10
    return {
        "gpu": 0 if stage == "export" else 1,
        "mem_mb": round_up((1.25 * host + 2) * 1024, 4096),
        "runtime": round_up(minutes, 30),
    }


def loaded_calibrate_gib(config: Any, settings: Mapping[str, Any]) -> float:
    """Host GiB of a calibration pass over the whole loaded model (the iterative method's
    stages, which run under the calibrate rule's resources): the model in the compute dtype,
    the cached hidden states (all in memory) and the Gram copies."""
    a, s = arch_parts(config), settings
    w = _w(s["dtype"])
    grams = (a["da"] ** 2 + a["ff"] ** 2) * _w(s.get("gram_dtype", "float32"))
    hidden: int = s["nsamples"] * s["seqlen"] * a["h"] * w
    return BASELINE_GIB["calibrate"] + CUDA_CONTEXT_GIB + (a["params"] * w + hidden + grams) / GIB


#: The published architecture of each model of workflow/configs/paper.yaml (arch.published).
PAPER_ARCHS = {
    "llama-3.1-8b": "Llama-3.1-8B",
    "llama-3-70b": "Llama-3-70B",
    "qwen2.5-7b": "Qwen2.5-7B",
    "qwen2.5-14b": "Qwen2.5-14B",
    "qwen2.5-32b": "Qwen2.5-32B",
    "qwen2.5-72b": "Qwen2.5-72B",
    "mistral-7b": "Mistral-7B-v0.1",
    "llama-2-7b": "Llama-2-7B",
    "llama-2-13b": "Llama-2-13B",
    "llama-2-70b": "Llama-2-70B",
    "qwen3-8b": "Qwen3-8B",
    "qwen3-14b": "Qwen3-14B",
    "qwen3-32b": "Qwen3-32B",
    "deepseek-r1-0528-qwen3-8b": "Qwen3-8B",
}
#: Tokens of WikiText-2's test split (ppl_max_windows: null): 0.34e6 with Llama-2's tokenizer,
#: fewer with the larger vocabularies.
PPL_TOKENS = 0.35e6
PLANNED_STAGES = ("calibrate", "compensate", "ppl", "zeroshot", "export")


def paper_settings(cfg: Mapping[str, Any], model: str) -> dict[str, Any]:
    """The plan's settings of one model of a (paper) config: its dtype, the largest calibration
    it runs (Fig. 2's sizes for Fig. 2's model), the evaluation sizes, the hidden-state budget."""
    cals = list(cfg["calibration"].values()) + list(cfg.get("iterative", {}).get("mixes", {}).values())
    big = max(cals, key=lambda c: c["nsamples"] * c["seqlen"])
    nsamples = big["nsamples"]
    if cfg.get("fig2", {}).get("model") == model:
        nsamples = max(nsamples, *cfg["fig2"]["nsamples"])
    ev, comp = cfg["evaluation"], cfg.get("compute", {})
    it = cfg.get("iterative", {})
    loaded = model in it.get("table", {}).get("models", []) or model == it.get("calibration_size", {}).get("model")
    return {
        "dtype": cfg["models"][model]["dtype"],
        "loaded": loaded,
        "gram_dtype": big.get("gram_dtype", "float32"),
        "nsamples": nsamples,
        "seqlen": big["seqlen"],
        "batch": big.get("batch_size", 8),
        "ppl_tokens": PPL_TOKENS,
        "ppl_seqlen": ev["ppl_seqlen"],
        "ppl_batch": ev["ppl_batch_size"],
        "zs_tokens": ZEROSHOT_TOKENS,
        "zs_max_length": ev["zeroshot_max_length"],
        "zs_batch": ev["zeroshot_batch_size"],
        "block": comp.get("compensate_block", 1) or 1,
        "budget_gib": comp.get("hidden_cache_budget_gb", schema_default("compute.hidden_cache_budget_gb")),
    }


def paper_resources(cfg: Mapping[str, Any]) -> dict[str, dict[str, dict[str, int]]]:
    """model -> rule -> ``{"gpu", "mem_mb", "runtime"}`` for every model of ``cfg`` that
    :data:`PAPER_ARCHS` knows (the rules calibrate, compensate, ppl, zeroshot, export; the
    calibrate rule of a model of the iterative tables also holds the whole model, which the
    iterative method's stages load)."""
    out = {}
    for model in cfg["models"]:
        if model in PAPER_ARCHS:
            arch, s = PUBLISHED_ARCHS[PAPER_ARCHS[model]], paper_settings(cfg, model)
            out[model] = {st: slurm_resources(arch, st, s) for st in PLANNED_STAGES}
    return out


def main(argv: list[str] | None = None) -> None:
    """``python -m coec.workflow.plan [config.yaml ...]``: the planned resources of every
    model (paper.yaml by default, later files merged over earlier ones) as YAML and a table."""
    paths = (argv if argv is not None else sys.argv[1:]) or ["workflow/configs/paper.yaml"]
    cfg: dict[str, Any] = {}
    for p in paths:
        for k, v in (yaml.safe_load(Path(p).read_text()) or {}).items():
            cfg[k] = {**cfg.get(k, {}), **v} if isinstance(v, dict) and isinstance(cfg.get(k), dict) else v

    print("| model | stage | host GiB | device GiB | gpu | mem_mb | runtime (min) |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for model, rules in paper_resources(cfg).items():
        arch, s = PUBLISHED_ARCHS[PAPER_ARCHS[model]], paper_settings(cfg, model)
        for st, r in rules.items():
            m = stage_memory(arch, st, s, gpu=True)
            print(
                f"| {model} | {st} | {m['host_gib']:.1f} | {m['device_gib']:.1f} | {r['gpu']} | "
                f"{r['mem_mb']} | {r['runtime']} |"
            )


if __name__ == "__main__":
    main()
