#!/usr/bin/env python
"""The obs selection's ``batch`` option: time against final error (docs/obs.md "Batch").

One down_proj-shaped module (d_out 576, d_in 1,536: SmolLM2-135M's MLP) and ~16k tokens of
correlated, heavy-tailed inputs (``rank`` shared factors and each channel's own part, both scale
mixtures of Gaussians with log-normal scales; per-channel scales and means), pruned at ``ratio``
by ``coec.select.obs.obs_prune`` with ``batch`` channels removed per greedy step. Per batch: the
seconds (thread CPU time at one thread, the damped inverse included; the inverse alone in the
header), the predicted error (= lstsq's refit error at obs's λ, tests/unit/test_select_obs.py)
and its excess over batch 1; the paper scores' keep sets refit at the same λ for scale. ``all``
removes every channel in one step (one-shot OBS).

    python benchmarks/obs_batch.py                              # the table in docs/obs.md
    python benchmarks/obs_batch.py --d-in 4096 --d-out 1536 --seeds 1 --batches 1,8,32,128
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from coec.select.obs import damped_inverse, obs_prune
from coec.select.scores import column_scores, n_keep, top_k_sorted

F64 = torch.float64


def inputs(n: int, d: int, rank: int, tail: float, g: torch.Generator) -> torch.Tensor:
    """(n, d) correlated heavy-tailed inputs (module docstring; ``tail`` the log-normal scales'
    sigma), float64."""

    def heavy(*shape: int) -> torch.Tensor:
        scale = torch.exp(tail * torch.randn(*shape, generator=g, dtype=F64))
        return torch.randn(*shape, generator=g, dtype=F64) * scale

    X = heavy(n, rank) @ torch.randn(rank, d, generator=g, dtype=F64) / rank**0.5 + 0.5 * heavy(n, d)
    return X * torch.exp(0.5 * torch.randn(d, generator=g, dtype=F64)) + 0.3 * torch.randn(d, generator=g, dtype=F64)


def refit_relerr(W: torch.Tensor, G: torch.Tensor, keep: list[int], lam: float) -> float:
    """||(W − Ŵ) X||² / ||W X||² of the ridge refit Ŵ = W G_{:,K} (G_KK + λI)⁻¹ of columns ``keep``."""
    K = torch.tensor(keep)
    A = G[K[:, None], K] + lam * torch.eye(len(keep), dtype=F64)
    R = W.clone()
    R[:, K] -= torch.linalg.solve(A, (W @ G[:, K]).mT).mT
    return float(((R @ G) * R).sum() / ((W @ G) * W).sum())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--d-out", type=int, default=576)
    ap.add_argument("--d-in", type=int, default=1536)
    ap.add_argument("--tokens", type=int, default=16384)
    ap.add_argument("--rank", type=int, default=64, help="shared factors of the inputs")
    ap.add_argument("--tail", type=float, default=0.9, help="sigma of the inputs' log-normal scales")
    ap.add_argument("--ratio", type=float, default=0.3)
    ap.add_argument("--damp", type=float, default=0.01)
    ap.add_argument("--batches", default="1,2,4,8,16,32,64,128,all")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    keep = n_keep(a.d_in, a.ratio)
    n_remove = a.d_in - keep
    batches = [n_remove if b == "all" else int(b) for b in a.batches.split(",")]
    rows: dict[int, dict[str, list[float]]] = {b: {"s": [], "err": [], "steps": [], "same": []} for b in batches}
    paper: dict[str, list[float]] = {s: [] for s in ("wanda_sp", "flap", "rcpu")}
    paper_same: dict[str, list[float]] = {s: [] for s in paper}
    inv_s = []
    for seed in range(a.seeds):
        g = torch.Generator().manual_seed(seed)
        X = inputs(a.tokens, a.d_in, a.rank, a.tail, g)
        W = torch.randn(a.d_out, a.d_in, generator=g, dtype=F64) / a.d_in**0.5
        G, total = X.mT @ X, X.sum(0)
        del X
        first: set[int] = set()
        t = time.thread_time()
        _, lam = damped_inverse(G, a.damp)
        inv_s.append(time.thread_time() - t)
        for b in batches:
            t = time.thread_time()
            res = obs_prune(W, G, keep, damp=a.damp, batch=b)
            rows[b]["s"].append(time.thread_time() - t)
            rows[b]["err"].append(res.relerr)
            rows[b]["steps"].append(len(res.increases))
            first = first if b != batches[0] else set(res.keep)
            rows[b]["same"].append(len(first & set(res.keep)) / keep)
        for s in paper:
            kept = top_k_sorted(column_scores(s, W, G.diagonal(), total, a.tokens), keep)
            paper[s].append(refit_relerr(W, G, kept, lam))
            paper_same[s].append(len(first & set(kept)) / keep)
    print(
        f"# d_out {a.d_out}, d_in {a.d_in}, {a.tokens} tokens (rank {a.rank}, tail {a.tail}), "
        f"ratio {a.ratio}: keep {keep}, remove {n_remove}; damp {a.damp}; {a.seeds} seeds, {a.threads} thread(s); "
        f"damped inverse {statistics.mean(inv_s):.2f} s"
    )
    base = statistics.mean(rows[batches[0]]["err"])
    print("| batch | steps | seconds | predicted relerr | vs batch 1 | kept as batch 1 |")
    print("|---:|---:|---:|---:|---:|---:|")
    for b in batches:
        r = rows[b]
        err = statistics.mean(r["err"])
        excess = statistics.mean(e / e1 - 1 for e, e1 in zip(r["err"], rows[batches[0]]["err"]))
        name = f"{b} (all)" if b == n_remove else str(b)
        print(
            f"| {name} | {int(statistics.mean(r['steps']))} | {statistics.mean(r['s']):.2f} | "
            f"{err:.5f} | {100 * excess:+.3f} % | {100 * statistics.mean(r['same']):.1f} % |"
        )
    for s, errs in paper.items():
        err = statistics.mean(errs)
        same = 100 * statistics.mean(paper_same[s])
        print(f"| {s} (refit) | – | – | {err:.5f} | {100 * (err / base - 1):+.1f} % | {same:.1f} % |")


if __name__ == "__main__":
    main()
