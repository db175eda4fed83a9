#!/usr/bin/env python
"""How ill-conditioned COEC's left rotations are, how each left-polar method copes, and its cost.

The left rotation is ``polar(A)``, A = Gyx Vt^T diag(S). On CUDA it is computed by an fp64 eigh of
A^T A (``linalg.polar_eigh``), which needs the spectrum of A^T A resolved. This script records, for
every left polar of a COEC run with ``left_polar: eigh``, cond(A^T A), whether it fell back to the
SVD, and whether the earlier eigh rule (fall back when cond(A^T A) >= 1e12) would have; plus the
Newton–Schulz iterations of each Cayley inverse (square right solves). ``--time`` times the two
polar methods (SVD, eigh) on the first left-rotation matrix of each synthetic module.

    # synthetic 8B-shaped layers (bench_compensate's problems), 1 round each, polar timings
    python benchmarks/left_polar.py --shapes 8b --max-rounds 1 --time 2
    python benchmarks/left_polar.py --shapes 8b --max-rounds 1 --time 3 --device cuda
    python benchmarks/left_polar.py --shapes 8b --modules o_proj --max-rounds 1 --time 2
    # the embedded model's real layers of one cell: eigh against SVD after 5 rounds
    python benchmarks/left_polar.py --cell results/smollm2-135m/enwiki-32x512/rcpu-0.3 \
        --grams results/smollm2-135m/grams/enwiki-32x512 --max-rounds 5

It observes the library by wrapping ``polar_eigh`` (as coec calls it) and
``ns_inverse`` (as the Cayley retraction calls it) for the duration of a run; nothing else changes.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import statistics
import sys
import time
from pathlib import Path

import torch
from timing import device_sync

from coec.compensate import compensate
from coec.compensate.linalg import polar, polar_eigh

OLD_MAX_COND_ATA = 1e12  # the earlier polar_eigh rule: SVD whenever cond(A^T A) >= 1e12
POLARS = {"svd": polar, "eigh": polar_eigh}
POLAR = "eigh"  # the left polar under test


@contextlib.contextmanager
def observed():
    """Record (cond(A^T A), fell back?) per eigh left polar, the first left-rotation
    matrix (``log["A"]``), and the iterations per Cayley inverse."""
    coec_mod = importlib.import_module("coec.compensate.algorithm1")
    retraction = importlib.import_module("coec.compensate.retraction")
    saved = {name: getattr(coec_mod, name) for name in ("polar_eigh",)}
    ns_inverse = retraction.ns_inverse
    log = {"left": [], "ns_iters": [], "A": None}

    def logged(fn):
        def wrapper(A, record=None, **kw):
            A64 = A.to(torch.float64)
            w = torch.linalg.eigvalsh(A64.mT @ A64)
            cond = float(w[-1] / w[0]) if float(w[0]) > 0 else float("inf")
            own = [] if record is None else record
            n = len(own)
            out = fn(A, own, **kw)
            log["left"].append((cond, any(r.endswith("->svd") for r in own[n:])))
            if log["A"] is None:
                log["A"] = A.detach().clone()
            return out

        return wrapper

    for name, fn in saved.items():
        setattr(coec_mod, name, logged(fn))

    def ns_inverse_logged(*a, **kw):
        X, it = ns_inverse(*a, **kw)
        log["ns_iters"].append(it)
        return X, it

    retraction.ns_inverse = ns_inverse_logged
    try:
        yield log
    finally:
        for name, fn in saved.items():
            setattr(coec_mod, name, fn)
        retraction.ns_inverse = ns_inverse


def summary(log, method: str) -> str:
    conds = [c for c, _ in log["left"]]
    fb = sum(f for _, f in log["left"])
    old_fb = sum(c >= OLD_MAX_COND_ATA for c in conds)
    txt = (
        f"{len(conds)} left polars, cond(A^T A) median {statistics.median(conds):.2e} max {max(conds):.2e}; "
        f"SVD fallbacks of {method}: {fb} (earlier eigh rule: {old_fb})"
    )
    if log["ns_iters"]:
        txt += f"; Newton-Schulz iterations per Cayley inverse: {sorted(set(log['ns_iters']))}"
    return txt


def time_polars(A: torch.Tensor, repeat: int) -> str:
    """Best-of-``repeat`` seconds of each polar method on A (after one warm-up call each), and
    how far its <P, A> falls below the SVD polar's (the Procrustes maximum)."""
    dev, parts, best_obj = A.device, [], None
    for name, fn in POLARS.items():
        rec: list = []
        P = fn(A, rec)
        device_sync(dev)
        best = float("inf")
        for _ in range(repeat):
            t0 = time.perf_counter()
            fn(A, [])
            device_sync(dev)
            best = min(best, time.perf_counter() - t0)
        obj = float((P.double() * A.double()).sum())
        best_obj = obj if best_obj is None else best_obj
        gap = (best_obj - obj) / abs(best_obj)
        parts.append(f"{name} {best:.3f} s (<P,A> gap {gap:+.1e}{', fell back' if rec else ''})")
    return f"polar of A {tuple(A.shape)} {str(A.dtype).replace('torch.', '')} on {dev}: " + "; ".join(parts)


def synthetic(a):
    sys.path.insert(0, str(Path(__file__).parent))
    from bench_compensate import DEFAULT_TOKENS, SHAPES, synth_problem

    dev = torch.device(a.device)
    for name, module, d_out, d_in, k, extra in SHAPES[a.shapes]:
        if a.modules and module not in a.modules.split(","):
            continue
        W0, G, mean, keep, vp, _ = synth_problem(module, d_out, d_in, k, extra, DEFAULT_TOKENS[a.shapes], 0, dev)
        opts = dict(max_rounds=a.max_rounds, tol=0.0, left_polar=POLAR)
        if module == "o_proj":
            opts.update(align_lambda=50.0, inputs={"value_proj": vp})
        with observed() as log:
            compensate(W0, G, mean, keep, "coec", **opts)
        print(f"[{name}] {summary(log, POLAR)}", flush=True)
        if a.time:
            print(f"[{name}] {time_polars(log['A'], a.time)}", flush=True)


def real_layers(a):
    from transformers import AutoConfig

    from coec.io.artifacts import read_gram_layer
    from coec.model.arch import attention_shape, o_proj_columns, pruned_value_proj
    from coec.model.load import layer_tensor_names, read_model_tensors, resolve_model_dir

    md = resolve_model_dir(a.model)
    geom = attention_shape(AutoConfig.from_pretrained(md))
    keep = json.loads((Path(a.cell) / "keep.json").read_text())
    rows, logs = [], {"left": [], "ns_iters": []}
    for i, k in enumerate(keep["layers"]):
        names = layer_tensor_names(i)
        w = read_model_tensors(md, [names["o_proj"], names["down_proj"], names["v_proj"]])
        for module, cols in (
            ("o_proj", o_proj_columns(k["kv_groups"], geom)),
            ("down_proj", torch.tensor(k["channels"])),
        ):
            st = read_gram_layer(a.grams, i, module)
            opts = dict(alpha=0.9, max_rounds=a.max_rounds, n_tokens=st["count"])
            if module == "o_proj":
                opts.update(
                    align_lambda=50.0,
                    inputs={"value_proj": pruned_value_proj(w[names["v_proj"]], k["kv_groups"], geom)},
                )
            ref = compensate(w[names[module]], st["gram"], st["mean"], cols, "coec", left_polar="svd", **opts)
            with observed() as log:
                out = compensate(w[names[module]], st["gram"], st["mean"], cols, "coec", left_polar=POLAR, **opts)
            logs["left"] += log["left"]
            logs["ns_iters"] += log["ns_iters"]
            rel = (out.info["relerr_after"] - ref.info["relerr_after"]) / ref.info["relerr_after"]
            rows.append((i, module, rel))
    print(f"{a.cell}: {len(rows)} modules, {a.max_rounds} rounds; {summary(logs, POLAR)}")
    for module in ("o_proj", "down_proj"):
        d = [abs(r) for _, m, r in rows if m == module]
        print(
            f"  {module}: |relerr({POLAR}) - relerr(svd)| / relerr(svd): median {statistics.median(d):.1e}, "
            f"max {max(d):.1e}"
        )
    print(f"  {POLAR} lower in {sum(r < 0 for *_, r in rows)} of {len(rows)} modules")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shapes", default="8b", choices=["embedded", "8b", "70b"])
    ap.add_argument("--cell", default=None, help="a results cell folder with keep.json (real layers)")
    ap.add_argument("--grams", default=None, help="its calibration's Gram folder")
    ap.add_argument("--model", default="resources/models/smollm2-135m")
    ap.add_argument("--max-rounds", type=int, default=2)
    ap.add_argument(
        "--time",
        type=int,
        default=0,
        metavar="N",
        help="synthetic: time svd / eigh polars on the first left-rotation matrix, best of N",
    )
    ap.add_argument("--device", default="cpu", help="synthetic problems' device (cpu, cuda)")
    ap.add_argument("--modules", default=None, help="synthetic: only these modules (o_proj,down_proj)")
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
