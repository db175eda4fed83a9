#!/usr/bin/env python
"""How ill-conditioned COEC's left rotations are, and whether the eigh polar handles them.

The left rotation is ``polar(A)``, A = Gyx Vt^T diag(S). On CUDA it is computed by an fp64 eigh of
A^T A (``linalg.polar_eigh``), which needs the spectrum of A^T A resolved. This script records,
for every left polar of a COEC run, cond(A^T A), whether the eigh path took it (or fell back to
the SVD), and whether the earlier rule (fall back when cond(A^T A) >= 1e12) would have fallen
back; plus the Newton–Schulz iterations of each Cayley inverse (square right solves).

    # synthetic 8B-shaped layers (bench_compensate's problems), 2 rounds each
    python benchmarks/left_polar.py --shapes 8b --max-rounds 2
    # the embedded model's real layers of one cell: eigh against SVD left polar after 5 rounds
    python benchmarks/left_polar.py --cell results/smollm2-135m/enwiki-32x512/rcpu-0.3 \
        --grams results/smollm2-135m/grams/enwiki-32x512 --max-rounds 5

It observes the library by wrapping ``polar_eigh`` (as coec calls it) and ``ns_inverse`` (as the
Cayley retraction calls it) for the duration of a run; nothing else changes.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
from pathlib import Path

import torch

from coec.compensate import compensate

OLD_MAX_COND_ATA = 1e12  # the earlier polar_eigh rule: SVD whenever cond(A^T A) >= 1e12


@contextlib.contextmanager
def observed():
    """Record (cond(A^T A), fell back?) per left polar and the iterations per Cayley inverse."""
    coec_mod = sys.modules["coec.compensate.coec"]
    stiefel = sys.modules["coec.compensate.stiefel"]
    polar_eigh, ns_inverse = coec_mod.polar_eigh, stiefel.ns_inverse
    log = {"left": [], "ns_iters": []}

    def polar_eigh_logged(A, record=None, **kw):
        A64 = A.to(torch.float64)
        w = torch.linalg.eigvalsh(A64.mT @ A64)
        cond = float(w[-1] / w[0]) if float(w[0]) > 0 else float("inf")
        own = [] if record is None else record
        n = len(own)
        out = polar_eigh(A, own, **kw)
        log["left"].append((cond, "polar_eigh->svd" in own[n:]))
        return out

    def ns_inverse_logged(*a, **kw):
        X, it = ns_inverse(*a, **kw)
        log["ns_iters"].append(it)
        return X, it

    coec_mod.polar_eigh, stiefel.ns_inverse = polar_eigh_logged, ns_inverse_logged
    try:
        yield log
    finally:
        coec_mod.polar_eigh, stiefel.ns_inverse = polar_eigh, ns_inverse


def summary(log) -> str:
    conds = [c for c, _ in log["left"]]
    new_fb = sum(fb for _, fb in log["left"])
    old_fb = sum(c >= OLD_MAX_COND_ATA for c in conds)
    txt = (f"{len(conds)} left polars, cond(A^T A) median {statistics.median(conds):.2e} max {max(conds):.2e}; "
           f"SVD fallbacks: {new_fb} (earlier rule: {old_fb})")
    if log["ns_iters"]:
        txt += f"; Newton-Schulz iterations per Cayley inverse: {sorted(set(log['ns_iters']))}"
    return txt


def synthetic(a):
    sys.path.insert(0, str(Path(__file__).parent))
    from bench_compensate import DEFAULT_TOKENS, SHAPES, synth_problem

    for name, module, d_out, d_in, k, extra in SHAPES[a.shapes]:
        W0, G, mean, keep, vp, _ = synth_problem(module, d_out, d_in, k, extra, DEFAULT_TOKENS[a.shapes], 0,
                                                  torch.device("cpu"))
        opts = dict(max_rounds=a.max_rounds, tol=0.0, left_polar="eigh")
        if module == "o_proj":
            opts.update(align_lambda=50.0, value_proj=vp)
        with observed() as log:
            compensate(W0, G, mean, keep, "coec", **opts)
        print(f"[{name}] {summary(log)}", flush=True)


def real_layers(a):
    from coec.calibrate import load_layer_stats
    from coec.models import attention_geometry, layer_tensor_names, read_tensors, resolve_model_dir
    from coec.pipeline import expanded_value_proj
    from coec.select import o_proj_columns
    from transformers import AutoConfig

    md = resolve_model_dir(a.model)
    geom = attention_geometry(AutoConfig.from_pretrained(md))
    keep = json.loads((Path(a.cell) / "keep.json").read_text())
    rows, logs = [], {"left": [], "ns_iters": []}
    for i, k in enumerate(keep["layers"]):
        names = layer_tensor_names(i)
        w = read_tensors(md, [names["o_proj"], names["down_proj"], names["v_proj"]])
        for module, cols in (("o_proj", o_proj_columns(k["kv_groups"], geom)),
                             ("down_proj", torch.tensor(k["channels"]))):
            st = load_layer_stats(a.grams, i, module)
            opts = dict(alpha=0.9, max_rounds=a.max_rounds, n_tokens=st["count"])
            if module == "o_proj":
                opts.update(align_lambda=50.0,
                            value_proj=expanded_value_proj(w[names["v_proj"]], k["kv_groups"], geom))
            ref = compensate(w[names[module]], st["gram"], st["mean"], cols, "coec", left_polar="svd", **opts)
            with observed() as log:
                out = compensate(w[names[module]], st["gram"], st["mean"], cols, "coec", left_polar="eigh", **opts)
            logs["left"] += log["left"]
            logs["ns_iters"] += log["ns_iters"]
            rel = (out.info["relerr_after"] - ref.info["relerr_after"]) / ref.info["relerr_after"]
            rows.append((i, module, rel))
    print(f"{a.cell}: {len(rows)} modules, {a.max_rounds} rounds; {summary(logs)}")
    for module in ("o_proj", "down_proj"):
        d = [abs(r) for _, m, r in rows if m == module]
        print(f"  {module}: |relerr(eigh) - relerr(svd)| / relerr(svd): median {statistics.median(d):.1e}, "
              f"max {max(d):.1e}")
    print(f"  eigh lower in {sum(r < 0 for *_, r in rows)} of {len(rows)} modules")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shapes", default="8b", choices=["embedded", "8b", "70b"])
    ap.add_argument("--cell", default=None, help="a results cell folder with keep.json (real layers)")
    ap.add_argument("--grams", default=None, help="its calibration's Gram folder")
    ap.add_argument("--model", default="resources/models/smollm2-135m")
    ap.add_argument("--max-rounds", type=int, default=2)
    ap.add_argument("--threads", type=int, default=None)
    a = ap.parse_args(argv)
    if a.threads:
        torch.set_num_threads(a.threads)
    if a.cell:
        if not a.grams:
            ap.error("--cell needs --grams")
        real_layers(a)
    else:
        synthetic(a)
    return 0


if __name__ == "__main__":
    sys.exit(main())
