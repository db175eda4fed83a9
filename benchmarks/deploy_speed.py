"""Deployment speed of a dense model and its pruned versions on one device: the GPU half of the
measured Table 4 (docs/deploy.md; the CPU half is the workflow target results/table4_measured.csv).

A model of a published shape with random weights (no download; speed does not depend on the
values) is pruned uniformly at each ratio (the kept KV groups and channels as the selection counts
them, ``coec.report.cost.pruned_shape``), every model stays on the device, and the repeats are
interleaved: repeat r times every model once. Each timing is a prefill of ``--prompt`` tokens and
``--new-tokens`` greedy decode steps at batch 1 (``coec.report.measured.timing``). Printed: tokens/s
(median and best), peak device memory, and each speedup beside its bound (weight bytes read per
decoded token; FLOPs per prefill token, ``coec.report.cost.flops_per_token``).

llama.cpp is timed on the GPU only when the installed llama-cpp-python was built with GPU offload
(``llama_supports_gpu_offload``); the PyPI source build used here has none, which is printed.

    python benchmarks/deploy_speed.py --random-arch Llama-3.1-8B --dtype bfloat16 --device cuda
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

TINY = {
    "model_type": "llama",
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "head_dim": 8,
    "intermediate_size": 96,
    "vocab_size": 320,
}


def build(arch: str, layers: int | None, dtype: str, device: str, ratio: float):
    """A random model of ``arch`` (a coec.report.cost.PUBLISHED_ARCHS name, or ``tiny``) pruned
    uniformly at ``ratio`` (0: dense), on ``device``; returns (model, config dict)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from coec.model.load import torch_dtype
    from coec.model.prune import prune_model_
    from coec.report.cost import PUBLISHED_ARCHS, pruned_shape

    spec = dict(TINY if arch == "tiny" else PUBLISHED_ARCHS[arch])
    if layers:
        spec["num_hidden_layers"] = layers
    family = spec.pop("model_type")
    cfg = AutoConfig.for_model(family, **spec)
    torch.set_default_dtype(torch_dtype(dtype))
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(cfg)
    torch.set_default_dtype(torch.float32)
    if ratio:
        shape = pruned_shape({**spec, "model_type": family}, ratio)
        kv = list(range(shape["num_key_value_heads"]))
        ch = list(range(shape["intermediate_size"]))
        prune_model_(model, {"layers": [{"kv_groups": kv, "channels": ch}] * cfg.num_hidden_layers})
    return model.eval(), {**spec, "model_type": family}


def bounds(cfg: dict, ratio: float, prompt: int) -> tuple[float, float]:
    """(weight bytes ratio for decode, FLOP ratio for prefill) of dense over pruned at ``ratio``."""
    from coec.report.cost import count_params, flops_per_token, pruned_shape

    shape = pruned_shape(cfg, ratio) if ratio else None
    ctx = (prompt + 1) / 2
    tied = bool(cfg.get("tie_word_embeddings"))  # a tied embedding is counted once, as the head

    def read(s):
        return count_params(cfg, s) - (0 if tied else cfg["vocab_size"] * cfg["hidden_size"])

    def flops(s):
        return flops_per_token(cfg, s, include_embedding=tied, context_len=ctx)

    return read(None) / read(shape), flops(None) / flops(shape)


def llamacpp_note() -> str:
    try:
        import llama_cpp
    except Exception as exc:  # not installed, or its shared library does not load
        return f"llama.cpp: not timed (llama-cpp-python not importable: {type(exc).__name__})"
    if not llama_cpp.llama_supports_gpu_offload():
        return "llama.cpp: not timed on the GPU (this llama-cpp-python build has no GPU offload)"
    return "llama.cpp: this build offloads to the GPU; time its GGUF exports with coec.report.measured.timing"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--random-arch", default="Llama-3.1-8B", help="PUBLISHED_ARCHS name or tiny")
    ap.add_argument("--layers", type=int, default=None, help="truncate the shape to N layers")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--ratios", default="0.1,0.2,0.3")
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    from coec.report.measured.timing import time_transformers

    ratios = [0.0] + [float(r) for r in a.ratios.split(",") if r]
    models = {r: build(a.random_arch, a.layers, a.dtype, a.device, r) for r in ratios}
    prompt = torch.randint(
        0, models[0.0][1]["vocab_size"], (a.prompt,), generator=torch.Generator().manual_seed(0)
    ).tolist()
    runs = {r: [] for r in ratios}
    peak = {}
    for rep in range(a.repeat):
        for r in ratios[rep % len(ratios) :] + ratios[: rep % len(ratios)]:
            if a.device.startswith("cuda"):
                torch.cuda.reset_peak_memory_stats()
            runs[r].append(time_transformers(models[r][0], prompt, a.new_tokens))
            if a.device.startswith("cuda"):
                peak[r] = max(peak.get(r, 0.0), torch.cuda.max_memory_allocated() / 2**30)
    rows = []
    for r in ratios:
        pre = [x["prefill_s"] for x in runs[r]]
        dec = [x["decode_s"] for x in runs[r]]
        rows.append(
            {
                "ratio": r,
                "prefill_tok_s": a.prompt / statistics.median(pre),
                "decode_tok_s": a.new_tokens / statistics.median(dec),
                "prefill_tok_s_best": a.prompt / min(pre),
                "decode_tok_s_best": a.new_tokens / min(dec),
                "peak_gib": peak.get(r),
            }
        )
    dense = rows[0]
    print(
        f"{a.random_arch} ({a.layers or 'all'} layers), {a.dtype} on {a.device}, prompt {a.prompt}, "
        f"{a.new_tokens} new tokens, batch 1, {a.repeat} interleaved repeats (median; best in the JSON)"
    )
    print(
        "| ratio | prefill tok/s | decode tok/s | peak GiB | prefill speedup | FLOP bound "
        "| decode speedup | byte bound | decode / bound |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for row in rows:
        byte_b, flop_b = bounds(models[0.0][1], row["ratio"], a.prompt)
        row.update(
            prefill_speedup=row["prefill_tok_s"] / dense["prefill_tok_s"],
            flop_bound=flop_b,
            decode_speedup=row["decode_tok_s"] / dense["decode_tok_s"],
            byte_bound=byte_b,
        )
        peak_s = f"{row['peak_gib']:.2f}" if row["peak_gib"] is not None else "–"
        print(
            f"| {row['ratio']:g} | {row['prefill_tok_s']:.1f} | {row['decode_tok_s']:.2f} | {peak_s} "
            f"| {row['prefill_speedup']:.3f} | {flop_b:.3f} | {row['decode_speedup']:.3f} | {byte_b:.3f} "
            f"| {row['decode_speedup'] / byte_b:.3f} |"
        )
    note = llamacpp_note()
    print(note)
    if a.json:
        Path(a.json).write_text(
            json.dumps({"args": vars(a), "rows": rows, "runs": runs, "llama_cpp": note}, indent=1) + "\n"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
