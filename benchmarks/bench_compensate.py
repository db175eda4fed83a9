#!/usr/bin/env python
"""Seconds per module for every compensation method at the embedded and paper shapes.

Synthetic but realistic calibration statistics: activations ``x = c * (B z) + mu`` with a
low-rank-ish factor B (decaying spectrum), a few outlier channels (c ~ 20-50x), a mean shift,
and an isotropic noise floor added analytically to the Gram (so G is full rank as with 262k
real tokens) -- G from N random tokens. W0 has log-normal column norms. The kept set follows
the paper's scope: o_proj keeps whole KV groups (Wanda-sp group score), down_proj keeps
ceil(0.7 d_ff) channels.

    python benchmarks/bench_compensate.py                       # embedded shapes, all methods
    python benchmarks/bench_compensate.py --shapes 8b --methods rcpu,coec --max-rounds 2
    python benchmarks/bench_compensate.py --device cuda --shapes all --json out.json
    python benchmarks/bench_compensate.py --widths 256,512,768,1024,1536 --max-rounds 5

Besides the measured table it prints a projection for every shape (also the ones not run): the
per-round matmul FLOP model divided by the matmul rate measured on the device, plus the
factorisations (left polar per round; tempering eigh and initial SVDs once) timed at n=1024
(CPU) or 2048 (CUDA) on the device and scaled by n^3. It is a rough guide; the measured columns
are what to plan with.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import sys
import time

import torch
from timing import device_sync, gemm_rate, span_totals

from coec.compensate import compensate
from coec.compensate.errors import OutputError

# name: (module, d_out, d_in, k, extra)   extra: for o_proj (n_heads, n_kv, head_dim, d_model)
SHAPES = {
    "embedded": [
        ("emb.o_proj", "o_proj", 576, 576, 384, (9, 3, 64, 576)),
        ("emb.down_proj", "down_proj", 576, 1536, 1076, None),
    ],
    "8b": [
        ("8b.o_proj", "o_proj", 4096, 4096, 3072, (32, 8, 128, 4096)),
        ("8b.down_proj", "down_proj", 4096, 14336, 10036, None),
    ],
    "70b": [
        ("70b.o_proj", "o_proj", 8192, 8192, 6144, (64, 8, 128, 8192)),
        ("70b.down_proj", "down_proj", 8192, 28672, 20071, None),
    ],
}
DEFAULT_TOKENS = {"embedded": 16384, "8b": 4096, "70b": 4096}


def width_shapes(w: int, ratio: float = 0.3):
    """A Llama-like layer of width w (head_dim 64, one query head per KV group, d_ff = 3.5 w
    rounded to 64) at `ratio`: o_proj keeps round((1 - ratio) n_kv) groups, down_proj
    ceil((1 - ratio) d_ff) channels -- the family of the width-scaling slope."""
    heads = max(2, w // 64)
    d_ff = 64 * round(3.5 * w / 64)
    kg = max(1, round((1 - ratio) * heads))
    return [
        (f"w{w}.o_proj", "o_proj", w, heads * 64, kg * 64, (heads, heads, 64, w)),
        (f"w{w}.down_proj", "down_proj", w, d_ff, math.ceil((1 - ratio) * d_ff), None),
    ]


def loglog_slope(xs, ys) -> float:
    """Least-squares slope of log y against log x."""
    lx = torch.tensor(xs, dtype=torch.float64).log()
    ly = torch.tensor(ys, dtype=torch.float64).log()
    lx = lx - lx.mean()
    return float((lx * (ly - ly.mean())).sum() / (lx * lx).sum())


def synth_problem(module, d_out, d_in, k, extra, n_tokens, seed, device, dtype=torch.float32, n_test=0):
    """W0 (d_out, d_in), G (d_in, d_in) = sum over n_tokens tokens, mean (d_in,), keep (k,),
    value_proj (o_proj) and a held-out Gram from n_test fresh tokens of the same distribution."""
    g = torch.Generator(device="cpu").manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, generator=g, dtype=dtype).to(device)

    m = max(8, d_in // 4)
    decay = torch.logspace(0, -1.5, m, dtype=dtype).to(device)
    B = randn(d_in, m) * decay / math.sqrt(m)
    scale = torch.ones(d_in, dtype=dtype, device=device)
    n_out = max(2, d_in // 256)
    idx = torch.randperm(d_in, generator=g)[:n_out].to(device)
    scale[idx] = torch.linspace(20.0, 50.0, n_out, dtype=dtype).to(device)
    mu = 0.3 * randn(d_in) * scale
    noise = 0.1

    def gram(n_tok):
        G = torch.zeros(d_in, d_in, dtype=dtype, device=device)
        s = torch.zeros(d_in, dtype=dtype, device=device)
        done = 0
        while done < n_tok:
            n = min(2048, n_tok - done)
            X = scale[:, None] * (B @ randn(m, n)) + mu[:, None]
            G += X @ X.mT
            s += X.sum(1)
            done += n
        G += n_tok * noise**2 * torch.diag(scale**2)  # isotropic noise floor, analytically
        return G, s / max(n_tok, 1)

    G, mean = gram(n_tokens)
    test = gram(n_test) if n_test else None
    colnorm = torch.exp(0.5 * randn(d_in))
    W0 = randn(d_out, d_in) / math.sqrt(d_in) * colnorm
    score = W0.norm(dim=0) * torch.sqrt(torch.diagonal(G))  # Wanda-sp
    vp = None
    if module == "o_proj":
        n_heads, n_kv, hd, d_model = extra
        group = d_in // n_kv
        gs = score.view(n_kv, group).sum(1)
        kg = k // group
        kept_groups = torch.sort(torch.topk(gs, kg).indices).values
        keep = (kept_groups[:, None] * group + torch.arange(group, device=device)).reshape(-1)
        v = randn(n_kv * hd, d_model) / math.sqrt(d_model)  # v_proj rows per KV head
        per = n_heads // n_kv
        rows = torch.cat([v[gi * hd : (gi + 1) * hd].repeat(per, 1) for gi in kept_groups.tolist()])
        vp = rows  # (k, d_model): each KV head's rows repeated for its query heads
    else:
        keep = torch.sort(torch.topk(score, k).indices).values
    return W0, G, mean, keep, vp, test


def heldout_relerr(out, W0, test, keep, n_test):
    """Relative error (float64) on n_test fresh tokens, the bias included (FLAP)."""
    G_test, mean_test = test
    return OutputError(
        W0.to(torch.float64), G_test.to(torch.float64) / n_test, keep, mean_test.to(torch.float64), scale=1.0
    )(out.weight, out.bias)


def round_flops(d_out, d_in, k, steps_per_round=1.5, ns_updates=0.1, carry=False, rg_refresh=4):
    """Matmul FLOP model of one COEC round (default options) and of the one-off setup.

    Reduced Stiefel step (r < k): the direction (``Xi R^T`` and ``sym(.) R``, 4 r^2 k) and its
    Rayleigh step (``g Gxx``, 2 r k^2), the retraction's ``X X^T`` (2 r^2 k), the evaluation
    ``R Gxx`` (2 r k^2); each Newton–Schulz update of the retraction adds 6 r^3 and the product
    ``Z X`` (2 r^2 k). ``ns_updates``: mean updates per retraction; most steps are small enough
    to need none (then ``ns_polar`` skips ``Z X``): 2 of 21 retractions needed one in 20 rounds
    of the embedded and the width-1024 down_proj. ``carry`` (``rg_update: carry``, the CUDA
    default): the evaluation's ``R Gxx`` comes through the retraction instead (``Z (X Gxx)``,
    2 r^2 k, with an update; nothing without), plus one ``R Gxx`` per ``rg_refresh`` steps.
    Factorisations are not in it: the left polar
    (one per round, r x r) and the tempering eigh plus the initial SVD (setup) are timed
    separately (``factor_times``) and scaled by n^3.
    """
    r = min(d_out, k)
    if r < k and carry:  # the evaluation's R Gxx carried through the retraction
        per_step = (
            2 * (r * k * k + 3 * r * r * k)
            + ns_updates * (6 * r**3 + 4 * r * r * k)
            + (2 * r * k * k / rg_refresh if rg_refresh else 0)
        )
    elif r < k:  # reduced Stiefel: gradient, projection, Rayleigh step, NS polar retraction, eval
        per_step = 2 * (2 * r * k * k + 3 * r * r * k) + ns_updates * (6 * r**3 + 2 * r * r * k)
    else:  # Cayley (square): gradient, skew part, Rayleigh, NS inverse (~5 it.), products, eval
        per_step = 2 * 20 * k**3
    fixed = 2 * (2 * r * d_out * k + 2 * d_out * k * r + d_out * r * r)  # P, Gyx V^T, A^T A
    setup = 2 * (3 * d_out * d_in * d_in + 2 * d_in**3 + k * k * d_in)  # G^a, W0 G, W0 G^a
    return {"per_step": per_step, "per_round": fixed + steps_per_round * per_step, "setup": setup}


def factor_times(device, n0=None):
    """Seconds of the factorisations at size n0 on this device: the left polar (as the library
    does it here), a float64 eigh and a float32 thin SVD; scale with (n / n0)^3."""
    from coec.compensate.linalg import polar, polar_eigh

    n0 = n0 or (2048 if device.type == "cuda" else 1024)  # small GPU calls are latency-bound
    A = torch.randn(n0, n0, device=device) * torch.logspace(0, -2, n0, device=device)
    G = (A @ A.mT).double()
    pol = polar_eigh if device.type == "cuda" else polar
    out = {}
    for name, f in (
        ("polar", lambda: pol(A)),
        ("eigh64", lambda: torch.linalg.eigh(G)),
        ("svd", lambda: torch.linalg.svd(A, full_matrices=False)),
    ):
        f()
        device_sync(device)
        t = time.perf_counter()
        f()
        device_sync(device)
        out[name] = time.perf_counter() - t
    return out, n0


@contextlib.contextmanager
def block_profiler(device, enabled: bool):
    """``torch.profiler.profile`` (CPU, plus CUDA on a GPU) when enabled, else a no-op yielding None."""
    if not enabled:
        yield None
        return
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=acts) as prof:
        yield prof


def print_breakdown(name, rows, total_s, info):
    """Seconds per named COEC block (inclusive; nested names are part of their parent)."""
    n_rounds = max(len(info.get("seconds_per_round") or []), 1)
    print(
        f"  breakdown of {name} coec ({total_s:.2f} s under the profiler, {n_rounds} rounds; "
        "host wall time per block, device kernel time where CUDA,\n"
        "  which misses the solver calls that the watchdog runs in its own thread):"
    )
    print("  | block | calls | s | s per call | % of call | device s |")
    print("  |---|---:|---:|---:|---:|---:|")
    for r in rows:
        per = r["cpu_s"] / max(r["calls"], 1)
        print(
            f"  | {r['name']} | {r['calls']} | {r['cpu_s']:.3f} | {per:.4f} | {100 * r['cpu_s'] / total_s:.1f} | "
            f"{r['device_s']:.3f} |"
        )


def print_width_scaling(rows, widths, methods):
    """Seconds per module against width, and the log-log slope per (module, method)."""
    print("\nWidth scaling (seconds; slope = d log t / d log width, least squares):")
    print("| module | method | " + " | ".join(f"w={w}" for w in widths) + " | slope |")
    print("|---|---|" + "---:|" * (len(widths) + 1))
    for module in [m for m in ("o_proj", "down_proj") if any(r["shape"].endswith(m) for r in rows)]:
        for method in methods:
            if method == "none":
                continue
            t = [
                next(r["seconds"] for r in rows if r["shape"] == f"w{w}.{module}" and r["method"] == method)
                for w in widths
            ]
            print(
                f"| {module} | {method} | " + " | ".join(f"{x:.3f}" for x in t) + f" | {loglog_slope(widths, t):.2f} |"
            )
            if method == "coec":
                pr = [
                    next(r["per_round_s"] for r in rows if r["shape"] == f"w{w}.{module}" and r["method"] == method)
                    for w in widths
                ]
                print(
                    f"| {module} | coec s/round | "
                    + " | ".join(f"{x:.4f}" for x in pr)
                    + f" | {loglog_slope(widths, pr):.2f} |"
                )


def layer_totals(rows) -> list[dict]:
    """Seconds per layer (o_proj + down_proj of one shape set) for every method that ran both:
    the wall time of the two ``compensate`` calls and, for COEC, its setup plus rounds alone
    (without the reported float64 errors)."""
    out = []
    sets = dict.fromkeys(r["shape"].split(".")[0] for r in rows)
    for sset in sets:
        for method in dict.fromkeys(r["method"] for r in rows):
            mods = [r for r in rows if r["method"] == method and r["shape"].split(".")[0] == sset]
            if {r["shape"].split(".")[1] for r in mods} != {"o_proj", "down_proj"}:
                continue
            row = {"set": sset, "method": method, "seconds": sum(r["seconds"] for r in mods)}
            if method == "coec" and all(r.get("setup_s") is not None for r in mods):
                row["coec_s"] = sum(r["setup_s"] + (r["per_round_s"] or 0.0) * r["rounds"] for r in mods)
            out.append(row)
    return out


def print_projection(rows, device, rate):
    """Projected COEC seconds for every preset shape (also the ones not run): the per-round
    matmul FLOP model at the measured matmul rate plus factorisations scaled by n^3."""
    measured = {r["shape"]: r for r in rows if r["method"] == "coec"}
    ft, n0 = factor_times(device)
    print(
        f"\nProjection: matmul FLOPs at {rate / 1e9:.1f} GFLOP/s plus factorisations scaled by n^3 from "
        f"n={n0} (polar {ft['polar']:.3f}s, eigh64 {ft['eigh64']:.3f}s, svd {ft['svd']:.3f}s); "
        "steps/round from the run where measured, else 1.5:"
    )
    print(
        "| shape | GFLOP/round | proj. setup s | proj. s/round | proj. 50 rounds s | measured setup s | measured s/round |"  # noqa: E501
    )
    print("|---|---:|---:|---:|---:|---:|---:|")
    for sset in ["embedded", "8b", "70b"]:
        for name, module, d_out, d_in, k, extra in SHAPES[sset]:
            m = measured.get(name)
            spr = m["steps_per_round"] if m and m.get("steps_per_round") else 1.5
            f = round_flops(d_out, d_in, k, spr, carry=device.type == "cuda")  # rg_update auto
            r = min(d_out, k)
            pr = f["per_round"] / rate + ft["polar"] * (r / n0) ** 3
            su = f["setup"] / rate + ft["eigh64"] * (d_in / n0) ** 3 + ft["svd"] * (d_out * k * r / n0**3)
            if module == "o_proj":
                su += ft["svd"] * (d_out * d_in * min(d_out, d_in) + k * d_out * min(k, d_out)) / n0**3
            meas = "" if not m or m.get("per_round_s") is None else f"{m['per_round_s']:.3f}"
            msu = "" if not m or m.get("setup_s") is None else f"{m['setup_s']:.2f}"
            print(
                f"| {name} | {f['per_round'] / 1e9:.1f} | {su:.2f} | {pr:.3f} | {su + 50 * pr:.1f} | {msu} | {meas} |"
            )


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shapes", default="embedded", choices=["embedded", "8b", "70b", "all"])
    ap.add_argument(
        "--widths",
        default=None,
        help="comma list of model widths (e.g. 256,512,1024,2048): time a Llama-like "
        "layer family instead of --shapes and fit the log-log slope per method",
    )
    ap.add_argument("--methods", default="none,bias,lstsq,rcpu,coec")
    ap.add_argument("--modules", default="o_proj,down_proj", help="comma list: o_proj,down_proj")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--tokens", type=int, default=None, help="calibration tokens (default per shape set)")
    ap.add_argument("--max-rounds", type=int, default=None, help="override coec max_rounds")
    ap.add_argument("--max-inner-steps", type=int, default=None)
    ap.add_argument("--align-lambda", type=float, default=50.0, help="on o_proj (paper default 50)")
    ap.add_argument("--compute-dtype", default=None)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--test-tokens", type=int, default=8192, help="held-out tokens (0: skip)")
    ap.add_argument("--coec-opts", default="", help="extra coec options as JSON, e.g. '{\"eta\": 2}'")
    ap.add_argument(
        "--breakdown",
        action="store_true",
        help="run COEC under torch.profiler and print seconds per named block (coec.compensate.profiling)",
    )
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    if a.threads:
        torch.set_num_threads(a.threads)
    device = torch.device(a.device)
    sets = ["embedded", "8b", "70b"] if a.shapes == "all" else [a.shapes]
    widths = [int(w) for w in a.widths.split(",")] if a.widths else []
    if widths:
        sets = [f"w{w}" for w in widths]
        for w in widths:
            SHAPES[f"w{w}"] = width_shapes(w)
            DEFAULT_TOKENS[f"w{w}"] = 4096
    methods = [m for m in a.methods.split(",") if m]
    cdt = a.compute_dtype  # None: the library default (float32 for coec)
    rate = gemm_rate(2048, 2048, 2048, getattr(torch, cdt or "float32"), device)
    print(
        f"device={device} compute_dtype={cdt or 'default'} threads={torch.get_num_threads()} "
        f"matmul={rate / 1e9:.1f} GFLOP/s ({cdt or 'float32'})"
    )
    rows = []
    if widths:  # untimed warm-up of every method (first-call costs would bend the small widths)
        _, module, d_out, d_in, k, extra = width_shapes(128)[0]
        W0, G, mean, keep, vp, _ = synth_problem(module, d_out, d_in, k, extra, 1024, a.seed, device)
        for method in methods:
            compensate(W0, G, mean, keep, method, n_tokens=1024, **({"max_rounds": 1} if method == "coec" else {}))
    for sset in sets:
        for name, module, d_out, d_in, k, extra in SHAPES[sset]:
            if module not in a.modules.split(","):
                continue
            n_tok = a.tokens or DEFAULT_TOKENS[sset]
            t = time.perf_counter()
            W0, G, mean, keep, vp, test = synth_problem(
                module, d_out, d_in, k, extra, n_tok, a.seed, device, n_test=a.test_tokens
            )
            device_sync(device)
            print(
                f"[{name}] d_out={d_out} d_in={d_in} k={k} tokens={n_tok} (synth {time.perf_counter() - t:.1f}s)",
                flush=True,
            )
            for method in methods:
                opts = {"compute_dtype": cdt} if cdt else {}
                opts["n_tokens"] = n_tok  # G sums over n_tok tokens (the bias's error needs it)
                if method == "coec":
                    if a.max_rounds is not None:
                        opts["max_rounds"] = a.max_rounds
                    if a.max_inner_steps is not None:
                        opts["max_inner_steps"] = a.max_inner_steps
                    if module == "o_proj" and a.align_lambda > 0:
                        opts.update(align_lambda=a.align_lambda, inputs={"value_proj": vp})
                    if a.coec_opts:
                        opts.update(json.loads(a.coec_opts))
                device_sync(device)
                t = time.perf_counter()
                with block_profiler(device, a.breakdown and method == "coec") as prof:
                    out = compensate(W0, G, mean, keep, method, **opts)
                    device_sync(device)
                sec = time.perf_counter() - t
                i = out.info
                row = {
                    "shape": name,
                    "method": method,
                    "seconds": sec,
                    "relerr_before": i["relerr_before"],
                    "relerr_after": i["relerr_after"],
                    "rounds": i.get("rounds", 0),
                    "inner_steps": i.get("inner_steps", 0),
                    "heldout": heldout_relerr(out, W0, test, keep, a.test_tokens) if test else None,
                }
                if method == "coec":
                    pr = i.get("seconds_per_round") or []
                    row.update(
                        setup_s=i.get("seconds_setup"),
                        per_round_s=(sum(pr) / len(pr)) if pr else None,
                        steps_per_round=(i["inner_steps"] / len(pr)) if pr else None,
                        stop=i.get("stop_reason"),
                        gcv_ends=i.get("gcv_at_grid_end"),
                        fallbacks=list(i.get("svd_fallbacks") or []),
                        rg_update=i.get("rg_update_used"),
                        rg_refreshes=(i.get("right") or {}).get("rg_refreshes"),
                        align=(i.get("align_before"), i.get("align_after")),
                    )
                if prof is not None:
                    row["breakdown"] = span_totals(prof)
                    print_breakdown(name, row["breakdown"], sec, i)
                rows.append(row)
                extra_txt = ""
                if method == "coec":
                    extra_txt = (
                        f" setup={row['setup_s']:.2f}s per_round={row['per_round_s'] or 0:.3f}s"
                        f" steps/round={row['steps_per_round'] or 0:.1f} stop={row['stop']}"
                        f" rg_update={row['rg_update']}"
                        f" gcv_ends={row['gcv_ends']}"
                    )
                    fb = i.get("svd_fallbacks") or []
                    if fb:
                        extra_txt += " fallbacks=" + ",".join(f"{n}x{fb.count(n)}" for n in sorted(set(fb)))
                    if row["align"][0] is not None:
                        extra_txt += f" align {row['align'][0]:.3g}->{row['align'][1]:.3g}"
                ho = "" if row["heldout"] is None else f" heldout={row['heldout']:.5f}"
                print(
                    f"  {method:6s} {sec:9.3f}s relerr {row['relerr_before']:.5f} -> {row['relerr_after']:.5f}{ho}"
                    f" rounds={row['rounds']} steps={row['inner_steps']}{extra_txt}",
                    flush=True,
                )
            del W0, G, mean, keep, vp, test

    print("\n| shape | method | seconds | relerr before | relerr after | held-out | rounds | inner steps | s/round |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        pr = r.get("per_round_s")
        ho = "" if r["heldout"] is None else f"{r['heldout']:.5f}"
        print(
            f"| {r['shape']} | {r['method']} | {r['seconds']:.3f} | {r['relerr_before']:.5f} | "
            f"{r['relerr_after']:.5f} | {ho} | {r['rounds']} | {r['inner_steps']} | {'' if pr is None else f'{pr:.3f}'} |"  # noqa: E501
        )

    totals = layer_totals(rows)
    if totals:
        print("\n| layer (o_proj + down_proj) | method | seconds | COEC setup + rounds s |")
        print("|---|---|---:|---:|")
        for t in totals:
            print(
                f"| {t['set']} | {t['method']} | {t['seconds']:.2f} | "
                f"{'' if t.get('coec_s') is None else format(t['coec_s'], '.2f')} |"
            )
    if widths:
        print_width_scaling(rows, widths, methods)
    else:
        print_projection(rows, device, rate)
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(
                {"device": str(device), "rate_flops": rate, "rows": rows, "layers": totals}, fh, indent=1, default=str
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
