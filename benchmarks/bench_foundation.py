"""Calibration and perplexity overhead against their plain-compute baselines, same run.

    python benchmarks/bench_foundation.py [--model resources/models/smollm2-135m]
        [--nseq 16 --seqlen 512 --batch 4 --dtype float32 --device cpu]

Prints:
- calibration time / (plain forward over the same tokens + the Gram accumulation alone)
- the Gram accumulation (upper block triangle per batch, mirrored per layer) against the full
  x^T x GEMM it replaces, same batches, same run
- calibration time / its FLOP bound: the decoder's forward FLOPs plus the Gram FLOPs, all at the
  GEMM rate measured in the model dtype on this device in the same run           (goal <= 1.25);
  the Gram FLOPs counted as a dense GEMM forms them (2 d^2 per token) and as the symmetric
  product needs them (d (d + 1))
- perplexity time / plain forward (logits only) over the same windows                (goal <= 1.1)
- on CUDA, the peak device memory of both (what the chunked float32 loss adds to the forward)
"""

from __future__ import annotations

import argparse
import time

import torch
from gram_blocks import dense_gram_add_  # a sibling script: benchmarks/ is the script's folder
from timing import device_sync, gemm_rate

from coec.calibrate.layer_pass import GramAccumulator, LayerRun, run_layerwise
from coec.evaluate.ppl import perplexity
from coec.model.load import load_model, resolve_device


def timed(fn, repeat=1):
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def calibration_flops(cfg, seqlen: int, symmetric: bool = False) -> tuple[float, float]:
    """(forward, Gram) FLOPs per token per decoder layer.

    Forward: 2 x the q/k/v/o/gate/up/down weights, plus causal attention (QK^T and AV over
    (seqlen + 1) / 2 keys on average). Gram: for each of the o_proj (d = heads x head_dim) and
    down_proj (d = intermediate) inputs, ``2 d^2`` as a dense GEMM computes it, or ``d (d + 1)``
    (one triangle) when ``symmetric``.
    """
    d, ff = cfg.hidden_size, cfg.intermediate_size
    h, kv = cfg.num_attention_heads, cfg.num_key_value_heads
    hd = getattr(cfg, "head_dim", None) or d // h
    linear = d * h * hd + 2 * d * kv * hd + h * hd * d + 3 * d * ff
    attn = 2 * 2 * h * hd * (seqlen + 1) / 2
    dims = (h * hd, ff)
    return 2 * linear + attn, sum(n * (n + 1) if symmetric else 2 * n * n for n in dims)


def random_model(arch: str, layers: int | None, dtype: str, device):
    """A randomly initialised model with a published architecture (no weights downloaded)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from coec.model.load import torch_dtype
    from coec.report.cost import PUBLISHED_ARCHS

    spec = dict(PUBLISHED_ARCHS[arch])
    family = spec.pop("model_type")
    if layers:
        spec["num_hidden_layers"] = layers
    cfg = AutoConfig.for_model(family, **spec)
    cfg._attn_implementation = "sdpa"
    torch.set_default_dtype(torch_dtype(dtype))
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(cfg)
    torch.set_default_dtype(torch.float32)
    return model.eval()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="resources/models/smollm2-135m")
    ap.add_argument("--nseq", type=int, default=16)
    ap.add_argument("--seqlen", type=int, default=512)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument(
        "--random-arch",
        default=None,
        help="a coec.report.cost.PUBLISHED_ARCHS name: random weights of that shape, no download",
    )
    ap.add_argument("--layers", type=int, default=None, help="truncate --random-arch to N layers")
    a = ap.parse_args()
    dev = resolve_device(a.device)
    if a.random_arch:
        model = random_model(a.random_arch, a.layers, a.dtype, dev)
        a.model = f"random {a.random_arch} ({model.config.num_hidden_layers} layers)"
    else:
        model, _ = load_model(a.model, dtype=a.dtype, device=dev)
    cfg = model.config
    ids = torch.randint(0, cfg.vocab_size, (a.nseq, a.seqlen), generator=torch.Generator().manual_seed(0))

    def sync():
        device_sync(dev)

    @torch.no_grad()
    def plain_forward():
        for i in range(0, a.nseq, a.batch):
            model.model(input_ids=ids[i : i + a.batch].to(dev), use_cache=False)  # decoder only, no lm_head
        sync()

    @torch.no_grad()
    def plain_logits():
        for i in range(0, a.nseq, a.batch):
            model(input_ids=ids[i : i + a.batch].to(dev), use_cache=False).logits
        sync()

    n_tok = a.batch * a.seqlen
    xa = torch.randn(n_tok, cfg.num_attention_heads * cfg.head_dim, device=dev, dtype=model.dtype)
    xm = torch.randn(n_tok, cfg.intermediate_size, device=dev, dtype=model.dtype)

    def grams_alone():  # as calibration does it: upper block triangle per batch, mirrored per layer
        for _ in range(cfg.num_hidden_layers):
            accs = [GramAccumulator(x.shape[1], dev) for x in (xa, xm)]
            for _ in range(a.nseq // a.batch):
                for acc, x in zip(accs, (xa, xm)):
                    acc.update(x)
            for acc in accs:
                acc.gram
        sync()

    def grams_full_gemm():  # the dense x^T x per batch it replaces, added to a float64 total
        for _ in range(cfg.num_hidden_layers):
            totals = [torch.zeros(x.shape[1], x.shape[1], dtype=torch.float64, device=dev) for x in (xa, xm)]
            for _ in range(a.nseq // a.batch):
                for tot, x in zip(totals, (xa, xm)):
                    dense_gram_add_(tot, x)
        sync()

    def calib():
        run_layerwise(model, ids, run=LayerRun(batch_size=a.batch, device=dev, progress=False))
        sync()

    def ppl():
        perplexity(model, ids, batch_size=a.batch, progress=False)
        sync()

    calib()  # warm-up
    t_fwd = timed(plain_forward, a.repeat)
    t_gram = timed(grams_alone, a.repeat)
    t_full = timed(grams_full_gemm, a.repeat)
    t_cal = timed(calib, a.repeat)
    t_log = timed(plain_logits, a.repeat)
    t_ppl = timed(ppl, a.repeat)
    tokens = a.nseq * a.seqlen
    f_fwd, f_gram = calibration_flops(cfg, a.seqlen)
    flops = tokens * cfg.num_hidden_layers * (f_fwd + f_gram)
    rate = gemm_rate(n_tok, cfg.hidden_size, cfg.intermediate_size, model.dtype, dev)
    bound = flops / rate
    f_sym = calibration_flops(cfg, a.seqlen, symmetric=True)[1]
    bound_sym = tokens * cfg.num_hidden_layers * (f_fwd + f_sym) / rate
    print(
        f"model {a.model} dtype {a.dtype} device {dev} tokens {tokens} "
        f"({a.nseq}x{a.seqlen}, batch {a.batch}), threads {torch.get_num_threads()}"
    )
    print(f"plain decoder forward     {t_fwd:8.2f} s  ({tokens / t_fwd:,.0f} tok/s)")
    print(
        f"Gram accumulation alone   {t_gram:8.2f} s  ({t_gram / t_full:.2f}x the dense x^T x GEMMs it "
        f"replaces: {t_full:.2f} s)"
    )
    print(
        f"calibration (layer-wise)  {t_cal:8.2f} s  ({tokens / t_cal:,.0f} tok/s)  "
        f"ratio {t_cal / (t_fwd + t_gram):.3f} to forward + Grams"
    )
    print(
        f"FLOP bound                {bound:8.2f} s  ({flops / 1e12:.2f} TFLOP: forward {f_fwd / (f_fwd + f_gram):.0%}, "
        f"Grams {f_gram / (f_fwd + f_gram):.0%}; {a.dtype} GEMM {rate / 1e12:.2f} TFLOP/s)  "
        f"calibration ratio {t_cal / bound:.3f} (goal <= 1.25); plain forward alone "
        f"{t_fwd * (f_fwd + f_gram) / (f_fwd * bound):.2f}x its own bound, Grams alone "
        f"{t_gram * (f_fwd + f_gram) / (f_gram * bound):.2f}x theirs"
    )
    print(
        f"FLOP bound, symmetric     {bound_sym:8.2f} s  (Grams counted as one triangle, d(d+1) per token)  "
        f"calibration ratio {t_cal / bound_sym:.3f}; Grams alone "
        f"{t_gram / (bound_sym - tokens * cfg.num_hidden_layers * f_fwd / rate):.2f}x theirs"
    )
    print(f"plain forward + logits    {t_log:8.2f} s")
    print(f"perplexity                {t_ppl:8.2f} s  ratio {t_ppl / t_log:.3f} (goal <= 1.1)")
    if dev.type == "cuda":  # what the loss adds on top of the forward (chunked float32 loss)
        peaks = {}
        for name, fn in (("plain forward + logits", plain_logits), ("perplexity", ppl)):
            torch.cuda.reset_peak_memory_stats(dev)
            fn()
            peaks[name] = torch.cuda.max_memory_allocated(dev) / 2**30
        print("peak device memory        " + ", ".join(f"{k} {v:.2f} GiB" for k, v in peaks.items()))


if __name__ == "__main__":
    main()
