#!/usr/bin/env python
"""What carrying ``R Gxx`` through the polar retraction (``rg_update: carry``) saves and costs.

Each trial of the right solve is evaluated at its new frame R, which needs ``R Gxx``, an
(r, k, k) product: with the Rayleigh step's ``g Gxx`` that is two of a down_proj step's five
large products. The polar retraction is ``R_new = F (R - t g)`` with F (r, r) its left factor,
so ``R_new Gxx = F (R Gxx - t g Gxx)``: the step size's ``g Gxx`` already gives it, for a scaling
(most steps, where F is a multiple of I) or an (r, r, k) product. The carried product strays from
a fresh one by round-off, so ``rg_refresh`` forms it afresh after that many carried updates.

On bench_compensate's synthetic down_proj problems (r < k: the polar retraction; o_proj's Cayley
retraction has nothing to carry) this runs COEC with ``rg_update: product`` (the CPU default),
``carry`` with no refresh, and ``carry`` with each refresh in ``--refresh``, and prints the
seconds (after a one-round warm-up; the float64 measurement below not counted), the final
calibration and held-out errors, the steps, and how far the float32 ``q = sum_i S_i^2
(R Gxx R^T)_ii`` that the objective is made of strays from its float64 value, over every round
(the frames each round hands on, against a float64 product of the same frame).
``--other-threads`` runs the product at a second thread count, which moves the float32
trajectory by summation order alone: the noise floor to read the carried runs' errors against.

    python benchmarks/rg_update.py                         # embedded down_proj and width 512, 50 rounds
    python benchmarks/rg_update.py --widths 1024 --no-embedded --max-rounds 20
    python benchmarks/rg_update.py --cell results/smollm2-135m/enwiki-32x512/wanda_sp-0.3 \
        --grams results/smollm2-135m/grams/enwiki-32x512 --max-rounds 20   # the real down_proj layers

With ``--cell`` (a results cell with keep.json) and ``--grams`` (its calibration's Gram folder) it
runs every real down_proj layer of that cell instead (the config's alpha 0.9, ``--max-rounds``):
the product at ``--threads`` and at ``--other-threads`` (the noise floor) and carry with the
first ``--refresh``, and prints how far each lands from the product, per layer and in summary.
"""

from __future__ import annotations

import argparse
import importlib
import json
import statistics
import time
from pathlib import Path

import torch
from bench_compensate import DEFAULT_TOKENS, SHAPES, heldout_relerr, synth_problem, width_shapes

from coec.compensate import compensate

coec_module = importlib.import_module("coec.compensate.algorithm1")  # the module (the package exports the function)


class QError:
    """Relative error of the float32 q against float64, for every frame a round hands on
    (``seconds``: the time this measurement took, which the caller subtracts)."""

    def __init__(self):
        self.values: list[float] = []
        self.seconds = 0.0
        self._orig = coec_module._frames

    def __enter__(self):
        def frames(U, S, Vt, Gxx, Gyx, RG=None):
            if RG is not None:
                t = time.perf_counter()
                R64 = Vt.double()
                S2 = S.double() ** 2
                e64 = (R64 * (R64 @ Gxx.double())).sum(1)
                e32 = (Vt * RG).sum(1).double()
                self.values.append(float(((e32 - e64) * S2).sum() / (e64 * S2).sum()))
                self.seconds += time.perf_counter() - t
            return self._orig(U, S, Vt, Gxx, Gyx, RG)

        coec_module._frames = frames
        return self

    def __exit__(self, *exc):
        coec_module._frames = self._orig


def run(problem, opts: dict, threads: int, max_rounds: int, n_test: int) -> dict:
    W0, G, mean, keep, test = problem
    torch.set_num_threads(threads)
    with QError() as q:
        t = time.perf_counter()
        out = compensate(W0, G, mean, keep, "coec", max_rounds=max_rounds, **opts)
        sec = time.perf_counter() - t - q.seconds
    i = out.info
    qa = [abs(v) for v in q.values] or [0.0]
    return {
        "seconds": sec,
        "relerr": i["relerr_after"],
        "heldout": heldout_relerr(out, W0, test, keep, n_test),
        "rounds": i["rounds"],
        "steps": i["inner_steps"],
        "trials": i["right"]["trials"],
        "refreshes": i["right"]["rg_refreshes"],
        "q_mean": sum(qa) / len(qa),
        "q_max": max(qa),
    }


def real_layers(a) -> None:
    """Every down_proj of a results cell: product (two thread counts) against carry."""
    from coec.io.artifacts import read_gram_layer
    from coec.model.load import layer_tensor_names, read_model_tensors, resolve_model_dir

    md = resolve_model_dir(a.model)
    keep = json.loads((Path(a.cell) / "keep.json").read_text())
    refresh = int(a.refresh.split(",")[0])
    variants = (
        ("product", {"rg_update": "product"}, a.threads),
        ("product-other", {"rg_update": "product"}, a.other_threads),
        ("carry", {"rg_update": "carry", "rg_refresh": refresh}, a.threads),
    )
    print(
        f"{a.cell}: down_proj, COEC alpha 0.9, {a.max_rounds} rounds; product at {a.threads} and "
        f"{a.other_threads} thread(s), carry (refresh {refresh}) at {a.threads}"
    )
    print("| layer | product relerr | s | other threads: rel. diff | carry: rel. diff | s | carried | refreshes |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    diffs = {"product-other": [], "carry": []}
    secs = {"product": 0.0, "carry": 0.0}
    for i, k in enumerate(keep["layers"]):
        name = layer_tensor_names(i)["down_proj"]
        W0 = read_model_tensors(md, [name])[name]
        st = read_gram_layer(a.grams, i, "down_proj")
        cols = torch.tensor(k["channels"])
        res = {}
        for label, opts, threads in variants:
            torch.set_num_threads(threads)
            t = time.perf_counter()
            out = compensate(
                W0,
                st["gram"],
                st["mean"],
                cols,
                "coec",
                alpha=0.9,
                max_rounds=a.max_rounds,
                n_tokens=st["count"],
                **opts,
            )
            res[label] = (out.info, time.perf_counter() - t)
        ref = res["product"][0]["relerr_after"]
        for label in diffs:
            diffs[label].append((res[label][0]["relerr_after"] - ref) / ref)
        secs["product"] += res["product"][1]
        secs["carry"] += res["carry"][1]
        ci = res["carry"][0]
        print(
            f"| {i} | {ref:.6f} | {res['product'][1]:.2f} | {diffs['product-other'][-1]:+.1e} | "
            f"{diffs['carry'][-1]:+.1e} | {res['carry'][1]:.2f} | {ci['right']['carried']} | "
            f"{ci['right']['rg_refreshes']} |",
            flush=True,
        )
    for label, d in diffs.items():
        m = [abs(x) for x in d]
        print(
            f"{label}: |relerr - relerr(product)| / relerr(product) median {statistics.median(m):.1e}, "
            f"max {max(m):.1e}; lower in {sum(x < 0 for x in d)} of {len(d)}"
        )
    print(
        f"seconds: product {secs['product']:.1f}, carry {secs['carry']:.1f} "
        f"(ratio {secs['carry'] / secs['product']:.3f})"
    )


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--widths", default="512", help="comma-separated widths of the down_proj family ('' for none)")
    ap.add_argument("--no-embedded", action="store_true", help="skip the embedded down_proj")
    ap.add_argument("--max-rounds", type=int, default=50)
    ap.add_argument("--refresh", default="4,16", help="comma-separated rg_refresh values to run with carry")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--other-threads", type=int, default=1, help="second thread count for the product (0: skip)")
    ap.add_argument("--tokens", type=int, default=DEFAULT_TOKENS["embedded"])
    ap.add_argument("--test-tokens", type=int, default=8192)
    ap.add_argument("--cell", default=None, help="a results cell folder with keep.json (real down_proj layers)")
    ap.add_argument("--grams", default=None, help="its calibration's Gram folder")
    ap.add_argument("--model", default="resources/models/smollm2-135m", help="the cell's model (with --cell)")
    a = ap.parse_args(argv)
    if a.cell:
        if not a.grams:
            ap.error("--cell needs --grams")
        real_layers(a)
        return

    shapes = [] if a.no_embedded else [SHAPES["embedded"][1]]
    shapes += [width_shapes(int(w))[1] for w in a.widths.split(",") if w]
    variants = [("product", {"rg_update": "product"}, a.threads)]
    if a.other_threads:
        variants.append((f"product, {a.other_threads} thread(s)", {"rg_update": "product"}, a.other_threads))
    variants.append(("carry, no refresh", {"rg_update": "carry", "rg_refresh": 0}, a.threads))
    variants += [
        (f"carry, refresh {n}", {"rg_update": "carry", "rg_refresh": int(n)}, a.threads)
        for n in a.refresh.split(",")
        if n
    ]
    print(
        f"COEC defaults but rg_update, {a.max_rounds} rounds, {a.tokens} calibration + {a.test_tokens} held-out "
        f"tokens, float32 on the CPU, {a.threads} thread(s) unless said"
    )
    print(
        "| problem | rg_update | s | ratio | relerr after | held-out | rounds | steps | trials | refreshes "
        "| q rel. err. vs float64: mean | max |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for name, module, d_out, d_in, k, extra in shapes:
        W0, G, mean, keep, _vp, test = synth_problem(
            module, d_out, d_in, k, extra, a.tokens, 0, torch.device("cpu"), n_test=a.test_tokens
        )
        problem = (W0, G, mean, keep, test)
        run(problem, {}, a.threads, 1, a.test_tokens)  # warm-up: first calls pay one-off costs
        base = None
        for label, opts, threads in variants:
            r = run(problem, opts, threads, a.max_rounds, a.test_tokens)
            base = base or r["seconds"]
            print(
                f"| {name} {d_out}x{k} | {label} | {r['seconds']:.2f} | {r['seconds'] / base:.3f} | "
                f"{r['relerr']:.6f} | {r['heldout']:.6f} | {r['rounds']} | {r['steps']} | {r['trials']} | "
                f"{r['refreshes']} | {r['q_mean']:.1e} | {r['q_max']:.1e} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
