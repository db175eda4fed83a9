"""Digests of every compensation method's output on synthetic problems: proves that a change of
the compensation code (memory, speed, structure) leaves each weight and bias byte as it was.

    PYTHONPATH=<old checkout>/src python benchmarks/method_digests.py --out before.json
    python benchmarks/method_digests.py --out after.json --compare before.json   # exit 1 on a change
    python benchmarks/method_digests.py --gram-check --out checked.json --compare before.json

``--gram-check``: every method is given its problem's Gram check (``coec.compensate.gram_check``,
formed once per calibration by the workflow), as a compensation job of the workflow runs it.

Run both sides with the same thread count (e.g. ``OMP_NUM_THREADS=1``): a BLAS splits its sums by
thread, so two thread counts give two sets of bits on the same code.

Problems: o_proj- and down_proj-like shapes, Grams that are PSD sums, have dead channels (exact
zeros, signed zeros after normalisation), are indefinite beyond App. B's tolerance, or are given
in float32 / float64; each method with its default options and the option values that take other
code paths (ridge 0, blend's ends, COEC without alignment). Each entry holds the sha256 of the
weight and bias bytes and, separately, of the info (seconds dropped) so a change that only moves a
diagnostic in its last bits is told apart from one that moves a weight.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys

import torch


def problems(seed: int) -> list[dict]:
    """Synthetic problems of one seed: name, W0, gram, mean, keep, n_tokens, value_proj."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for shape, (d_out, d_in, k, n) in {"oproj": (48, 48, 36, 200), "down": (40, 120, 84, 300)}.items():
        X = torch.randn(n, d_in, generator=g) * torch.rand(d_in, generator=g) + 0.3 * torch.randn(d_in, generator=g)
        W0 = 0.05 * torch.randn(d_out, d_in, generator=g)
        keep = torch.sort(torch.randperm(d_in, generator=g)[:k]).values
        V = 0.05 * torch.randn(k, 32, generator=g)  # the pruned value projection, (k, hidden)
        dead = X.clone()
        dead[:, ::7] = 0.0
        dead[:, 1::11] = -0.0 * dead[:, 1::11].abs()
        sym = torch.randn(d_in, d_in, generator=g)
        negzero = dead.T @ dead
        negzero[negzero == 0] = -0.0  # signed zeros in the Gram itself
        grams = {
            "psd32": (X.T @ X, X.mean(0)),
            "psd64": (X.double().T @ X.double(), X.double().mean(0)),
            "dead": (dead.T @ dead, dead.mean(0)),
            "negzero": (negzero, dead.mean(0)),
            "indefinite": (X.T @ X - 0.05 * n * (sym @ sym.T) / d_in, X.mean(0)),
            "asymmetric": (X.T @ X + 1e-3 * n * torch.rand(d_in, d_in, generator=g), X.mean(0)),
        }
        for kind, (G, mean) in grams.items():
            out.append(
                dict(
                    name=f"s{seed}.{shape}.{kind}", W0=W0, gram=G, mean=mean, keep=keep, n_tokens=float(n), value_proj=V
                )
            )
    return out


SPECS: list[tuple[str, dict]] = [
    ("none", {}),
    ("bias", {}),
    ("lstsq", {}),
    ("lstsq", {"ridge": 0.0}),
    ("rcpu", {}),
    ("coec", {"align_lambda": 0.0}),
    ("coec", {"alpha": 1.0, "max_rounds": 3}),
    ("blend", {"mix": "ridge"}),
    ("blend", {"mix": "base", "intercept": True}),
]


def digest(t: torch.Tensor | None) -> str | None:
    return None if t is None else hashlib.sha256(t.detach().cpu().contiguous().numpy().tobytes()).hexdigest()[:16]


def run(seeds: int, gram_check: bool = False) -> dict[str, dict]:
    from coec.compensate import compensate

    if gram_check:
        from coec.compensate.method import check_module

    res: dict[str, dict] = {}
    for seed in range(seeds):
        for p in problems(seed):
            for method, opts in SPECS:
                key = f"{p['name']}.{method}" + "".join(f".{k}={v}" for k, v in opts.items())
                inputs = {}
                if method == "coec" and opts.get("align_lambda", 1.0) > 0:
                    inputs = {"value_proj": p["value_proj"]}
                if method == "blend":
                    inputs = {"base_weight": p["W0"][:, p["keep"]] * 1.1, "base_bias": None}
                try:
                    out = compensate(
                        p["W0"],
                        p["gram"],
                        p["mean"],
                        p["keep"],
                        method,
                        inputs=inputs,
                        n_tokens=p["n_tokens"],
                        check=check_module(p["W0"], p["gram"]) if gram_check else None,
                        **opts,
                    )
                except Exception as exc:  # noqa: BLE001 - a refusal is a result too
                    res[key] = {"error": f"{type(exc).__name__}: {exc}"}
                    continue
                info = {k: v for k, v in out.info.items() if "seconds" not in k}
                res[key] = {
                    "weight": digest(out.weight),
                    "bias": digest(out.bias),
                    "info": hashlib.sha256(json.dumps(info, sort_keys=True).encode()).hexdigest()[:16],
                    "relerr": [info.get("relerr_before"), info.get("relerr_after")],
                }
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--seeds", type=int, default=4)
    ap.add_argument("--compare")
    ap.add_argument("--gram-check", action="store_true", help="give every method its problem's Gram check")
    a = ap.parse_args()
    torch.set_num_threads(max(1, torch.get_num_threads()))
    res = run(a.seeds, a.gram_check)
    with open(a.out, "w") as fh:
        json.dump(res, fh, indent=1, sort_keys=True)
    print(f"{len(res)} method runs -> {a.out}")
    if not a.compare:
        return 0
    with open(a.compare) as fh:
        before = json.load(fh)
    moved = {"weight or bias": 0, "info only": 0, "error": 0}
    for key in sorted(set(before) | set(res)):
        b, r = before.get(key, {}), res.get(key, {})
        if "error" in b or "error" in r:
            if b.get("error") != r.get("error"):
                moved["error"] += 1
                print(f"ERROR  {key}: {b.get('error')} -> {r.get('error')}")
        elif (b.get("weight"), b.get("bias")) != (r.get("weight"), r.get("bias")):
            moved["weight or bias"] += 1
            print(f"WEIGHT {key}")
        elif b.get("info") != r.get("info"):
            moved["info only"] += 1
            rel = [(x, y) for x, y in zip(b.get("relerr", []), r.get("relerr", []), strict=False) if x != y]
            print(f"INFO   {key}: relerr {rel}" if rel else f"INFO   {key}")
    same = len(res) - sum(moved.values())
    print(f"identical {same}/{len(res)}; " + ", ".join(f"{k}: {v}" for k, v in moved.items()))
    return 1 if moved["weight or bias"] or moved["error"] else 0


if __name__ == "__main__":
    sys.exit(main())
