"""How to keep the dense reference of the KL-to-dense metric (docs/kl.md): disk, peak memory and
time of each option, measured, then extrapolated by formula to the embedded model and to an 8B.

Options:
  full-fp16    every dense logit as float16, one tensor per window (llama.cpp's
               ``--kl-divergence-base`` keeps them so); the KL is exact up to the rounding
  top-k        the dense top-k log-probabilities, their token ids and the log of the rest
               (``coec.evaluate.kl``, 8 k + 4 bytes a position), the rest one bucket: a lower
               bound of the KL
  top-k+m      the same and m tokens sampled from the rest with their log-probabilities
               (8 (k + m) + 4 bytes a position): an unbiased estimate (the workflow's default)
  recompute    nothing stored: every cell's job runs the dense model too (one more dense forward
               per cell job) and takes the exact KL from both logits

Measured here (``--repeat`` times, the best):
  1. the tiny random Llama (vocabulary 320), end to end: a dense pass, each option's reference
     written and read, a perturbed "cell" scored against it (the options agree: top-k at the
     vocabulary equals the exact KL; a smaller k stays below it);
  2. per position at the target vocabularies (49,152 and 128,256; random logits, one chunk of
     ``--positions`` positions): each option's cost to build the reference and to score a cell,
     the float16 logits' write and read speed, and each step's peak memory (a child process's
     ``ru_maxrss`` above its state before the step);
  3. the float32 GEMM rate, for the dense forward that ``recompute`` adds (2 x params FLOPs a token).
Extrapolated: disk = bytes a position x positions; time = seconds a position x positions (+ the
dense forward at the GEMM rate for recompute); memory = the measured step peak + what is held.

With ``--real-model`` (a model folder, e.g. resources/models/smollm2-135m) and ``--cell KEEP
[COMP ...]`` (a cell of it) or ``--cell-dtype bfloat16`` (the dense model in 16 bits: a small KL),
the error of each stored form is measured on real distributions:
exact KL against full-fp16 / full-bf16 / top-k for several k over ``--real-windows`` windows.

    python benchmarks/kl_reference.py
    python benchmarks/kl_reference.py --real-model resources/models/smollm2-135m \\
        --real-text resources/text/enwiki/eval.txt --cell results/.../keep.json results/.../block0-29.safetensors
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from coec.evaluate.kl import exact_summed_kl, reference_rows, summed_kl  # noqa: E402

GB = 1e9
#: (name, vocabulary, positions scored, dense parameters): the embedded model's 48 windows of 512
#: (config.yaml) and an 8B on the paper's windows: 70 of 4096 (WikiText-2 test, ~289k Llama-3 tokens)
TARGETS = [
    ("embedded SmolLM2-135M", 49152, 48 * 512, 134_515_008),
    ("Llama-3.1-8B, paper windows", 128256, 70 * 4096, 8_030_261_248),
]
#: (k, m) of the top-k options measured and extrapolated
KMS = ((64, 0), (16, 16), (64, 64), (256, 64))


def best(fn, repeat: int) -> float:
    out = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return min(out)


def rss() -> int:
    """Resident bytes now (Linux /proc)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


# ----------------------------------------------------------------------------- per-position costs
def step(kind: str, V: int, P: int, k: int, m: int, repeat: int) -> dict:
    """One option's step on P positions of random logits over V tokens, in this (fresh) process:
    seconds (best of ``repeat``) and peak bytes above the state before it."""
    torch.manual_seed(0)
    q = torch.randn(1, P + 1, V).mul_(3)
    p = torch.randn(1, P + 1, V).mul_(0.3).add_(q)
    rows = reference_rows(p, k, m)
    path = Path(tempfile.mkdtemp()) / "ref.safetensors"
    from safetensors.torch import load_file, save_file

    if kind == "read-fp16":
        save_file({"w": p[0].half()}, str(path))
    base = rss()
    fns = {
        "topk-build": lambda: reference_rows(p, k, m),
        "topk-kl": lambda: summed_kl(q, rows),
        "exact-kl": lambda: exact_summed_kl(p, q),
        "write-fp16": lambda: save_file({"w": p[0].half()}, str(path)),
        "read-fp16": lambda: load_file(str(path))["w"].float(),
    }
    seconds = best(fns[kind], repeat)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return {"seconds": seconds, "per_position": seconds / P, "peak_bytes": max(0, peak - base)}


def run_step(kind: str, V: int, P: int, k: int, m: int, repeat: int) -> dict:
    """:func:`step` in a child process (its own peak memory)."""
    code = (
        f"import json; from kl_reference import step; print(json.dumps(step({kind!r}, {V}, {P}, {k}, {m}, {repeat})))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=Path(__file__).parent, capture_output=True, text=True, check=True
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def gemm_rate(repeat: int) -> float:
    """float32 FLOP/s of a 2048 x 2048 x 2048 product on this CPU."""
    a, b = torch.randn(2048, 2048), torch.randn(2048, 2048)
    return 2 * 2048**3 / best(lambda: a @ b, repeat)


# ----------------------------------------------------------------------------- tiny model, end to end
def tiny_end_to_end(repeat: int) -> list[str]:
    from safetensors.torch import load_file, save_file

    from coec.data import text as data
    from coec.model.cell import build_model
    from coec.model.tiny import CORPUS, make_model_dir

    work = Path(tempfile.mkdtemp())
    make_model_dir(work / "tiny", "llama")
    model, tok = build_model(str(work / "tiny"), "float32", "cpu")
    windows = data.eval_windows(torch.tensor(tok(CORPUS * 4)["input_ids"]), 64, 16)
    cell, _ = build_model(str(work / "tiny"), "float32", "cpu")
    torch.manual_seed(1)
    with torch.no_grad():
        for prm in cell.parameters():
            prm.mul_(1 + 0.2 * torch.randn_like(prm))
        dense_logits = model(input_ids=windows, use_cache=False).logits
        cell_logits = cell(input_ids=windows, use_cache=False).logits
    n, T = windows.shape
    positions = n * (T - 1)
    exact = float(exact_summed_kl(dense_logits, cell_logits)) / positions
    lines = [f"tiny Llama: {n} windows x {T} tokens, vocabulary {dense_logits.shape[-1]}; exact KL {exact:.6f}"]
    t_fwd = best(lambda: model(input_ids=windows, use_cache=False), repeat)
    path = work / "full.safetensors"
    t_w = best(lambda: save_file({f"w{i}": dense_logits[i].half() for i in range(n)}, str(path)), repeat)
    full = load_file(str(path))
    kl_full = (
        float(sum(exact_summed_kl(full[f"w{i}"][None].float(), cell_logits[i : i + 1]) for i in range(n))) / positions
    )
    lines.append(f"  full-fp16   disk {path.stat().st_size:>9} B  write {t_w:.4f}s  KL {kl_full:.6f}")
    for k, m in (*KMS, (dense_logits.shape[-1], 0)):
        t_b = best(lambda: reference_rows(dense_logits, k, m), repeat)
        rows = reference_rows(dense_logits, k, m)
        t_kl = best(lambda: summed_kl(cell_logits, rows), repeat)
        kl = float(summed_kl(cell_logits, rows)) / positions
        disk = sum(t.numel() * 4 for t in (rows.ids, rows.lps, rows.rest, rows.tail_ids, rows.tail_lps))
        lines.append(f"  {f'top-{k}+{m}':<11} disk {disk:>9} B  build {t_b:.4f}s  KL {kl:.6f} ({t_kl:.4f}s)")
    rate = f"{t_fwd:.4f}s here ({positions / t_fwd:.0f} positions/s)"
    lines.append(f"  recompute   disk 0 B  + one dense forward per cell job: {rate}")
    return lines


# ----------------------------------------------------------------------------- real model accuracy
def real_accuracy(
    model_dir: str, text: str, cell_files: list[str], dtype: str, n: int, seqlen: int, seeds: int
) -> list[str]:
    """The error of each stored form against the exact KL of a real cell: full-fp16 / full-bf16,
    top-k with the rest as a bucket (m = 0) and with m samples of the rest (``seeds`` draws:
    their mean error and spread). The cell: ``cell_files`` (keep.json, then block files; none: the
    dense model) in ``dtype``."""
    from coec.data import text as data
    from coec.model.cell import build_model

    dense, tok = build_model(model_dir, "float32", "cpu")
    keep, comp = (cell_files[0], cell_files[1:]) if cell_files else (None, [])
    cell, _ = build_model(model_dir, dtype, "cpu", keep, comp)
    windows = data.eval_windows(torch.tensor(tok(Path(text).read_text())["input_ids"]), seqlen, n)
    kms = [(k, m) for k in (16, 64, 256, 1024) for m in (0, 16, 64)]
    sums = {"exact": 0.0, "full-fp16": 0.0, "full-bf16": 0.0}
    draws = {(k, m): [0.0] * (seeds if m else 1) for k, m in kms}
    mass = {k: 0.0 for k, _ in kms}
    with torch.no_grad():
        for i, w in enumerate(windows):
            ids = w[None]
            p, q = dense(input_ids=ids, use_cache=False).logits, cell(input_ids=ids, use_cache=False).logits.float()
            sums["exact"] += float(exact_summed_kl(p, q))
            sums["full-fp16"] += float(exact_summed_kl(p.half().float(), q))
            sums["full-bf16"] += float(exact_summed_kl(p.bfloat16().float(), q))
            for (k, m), acc in draws.items():
                for seed in range(len(acc)):
                    rows = reference_rows(p, k, m, torch.Generator().manual_seed(100_003 * seed + i))
                    acc[seed] += float(summed_kl(q, rows))
                if not m:
                    mass[k] += float((1 - rows.rest.double().exp()).sum())
    positions = windows.shape[0] * (seqlen - 1)
    exact = sums["exact"] / positions
    what = f"the cell {keep}" if keep else "itself"
    lines = [f"{model_dir} vs {what} in {dtype}: {windows.shape[0]} windows x {seqlen}; exact mean KL {exact:.6f}"]
    for name in ("full-fp16", "full-bf16"):
        v = sums[name] / positions
        lines.append(f"  {name:<12} {v:.6f}  error {v - exact:+.6f} ({100 * (v - exact) / exact:+.3f} %)")
    for (k, m), acc in draws.items():
        errs = torch.tensor([a / positions - exact for a in acc], dtype=torch.float64)
        spread = f" ± {100 * float(errs.std()) / exact:.3f} % over {len(acc)} draws" if len(acc) > 1 else ""
        err = float(errs.mean())
        lines.append(
            f"  {f'top-{k}+{m}':<12} {exact + err:.6f}  error {err:+.6f} ({100 * err / exact:+.3f} %{spread})"
            f"  dense top-k mass {mass[k] / positions:.4f}"
        )
    return lines


# ----------------------------------------------------------------------------- extrapolation
def extrapolate(rate: float, repeat: int, P: int) -> list[str]:
    lines = [f"float32 GEMM {rate / 1e9:.1f} GFLOP/s; per-position costs on {P} positions of random logits"]
    for name, V, N, params in TARGETS:
        fwd = 2 * params * N / rate
        w, r = run_step("write-fp16", V, P, 1, 0, repeat), run_step("read-fp16", V, P, 1, 0, repeat)
        ex = run_step("exact-kl", V, P, 1, 0, repeat)
        lines += [f"{name}: vocabulary {V}, {N} positions; a dense forward {fwd:.0f}s at the GEMM rate",
                  "  option      disk (GB)  peak memory (GB)  reference job +s  every ppl job +s",
                  f"  full-fp16   {N * V * 2 / GB:9.2f}  {(w['peak_bytes'] + ex['peak_bytes']) / GB:16.2f}"
                  f"  {N * w['per_position']:16.1f}  {N * (r['per_position'] + ex['per_position']):15.1f}"]  # fmt: skip
        for k, m in KMS:
            b, kl = run_step("topk-build", V, P, k, m, repeat), run_step("topk-kl", V, P, k, m, repeat)
            held = N * (8 * (k + m) + 4)
            peak = held + max(b["peak_bytes"], kl["peak_bytes"])
            lines.append(
                f"  {f'top-{k}+{m}':<10} {held / GB:9.3f}  {peak / GB:16.2f}"
                f"  {N * b['per_position']:16.1f}  {N * kl['per_position']:15.1f}"
            )
        lines.append(
            f"  recompute   {0:9.2f}  {ex['peak_bytes'] / GB:16.2f}  {0:16.1f}  {fwd + N * ex['per_position']:15.1f}"
            "  (+ the dense model's layer and hidden states)"
        )
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--positions", type=int, default=512, help="positions of the per-position measurement")
    ap.add_argument("--skip-extrapolation", action="store_true", help="the tiny model only (tests)")
    ap.add_argument("--real-model", default=None)
    ap.add_argument("--real-text", default=None)
    ap.add_argument("--cell", nargs="+", default=None, metavar="KEEP [COMP ...]")
    ap.add_argument(
        "--cell-dtype", default="float32", help="the cell's dtype (bfloat16 without --cell: the dense model)"
    )
    ap.add_argument("--real-windows", type=int, default=8)
    ap.add_argument("--real-seqlen", type=int, default=512)
    ap.add_argument("--real-seeds", type=int, default=4, help="draws of the rest's samples")
    a = ap.parse_args()
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", torch.get_num_threads())))
    print(f"threads {torch.get_num_threads()}, torch {torch.__version__}")
    print("\n".join(tiny_end_to_end(a.repeat)))
    if not a.skip_extrapolation:
        print("\n".join(extrapolate(gemm_rate(a.repeat), a.repeat, a.positions)))
    if a.real_model:
        if not (a.real_text and (a.cell or a.cell_dtype != "float32")):
            ap.error("--real-model needs --real-text and --cell or --cell-dtype")
        print(
            "\n".join(
                real_accuracy(
                    a.real_model, a.real_text, a.cell or [], a.cell_dtype, a.real_windows, a.real_seqlen, a.real_seeds
                )
            )
        )


if __name__ == "__main__":
    main()
