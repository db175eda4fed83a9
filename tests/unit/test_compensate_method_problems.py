"""Synthetic pruning problems shared by the tests/unit/test_compensate_*.py files (plus a sanity test).

Realistic in the ways that matter for the solvers: low-rank-ish activations with a decaying
spectrum, a few outlier channels, a mean shift, and a structured (non-isotropic) W0.
"""

from __future__ import annotations

import math

import pytest
import torch


def make_problem(d_out=24, d_in=40, k=28, n_tokens=400, seed=0, outliers=2, dtype=torch.float64):
    """Return W0 (d_out, d_in), G = X X^T (sum over n_tokens), mean (d_in,), keep (k,), X."""
    g = torch.Generator().manual_seed(seed)
    m = max(4, d_in // 3)
    B = torch.randn(d_in, m, generator=g, dtype=dtype) * torch.logspace(0, -1.2, m, dtype=dtype) / math.sqrt(m)
    X = B @ torch.randn(m, n_tokens, generator=g, dtype=dtype)
    X += 0.1 * torch.randn(d_in, n_tokens, generator=g, dtype=dtype)
    X += 0.3 * torch.randn(d_in, 1, generator=g, dtype=dtype)
    if outliers:
        X[torch.randperm(d_in, generator=g)[:outliers]] *= 15.0
    W0 = torch.randn(d_out, d_in, generator=g, dtype=dtype) / math.sqrt(d_in)
    W0 = W0 * torch.exp(0.4 * torch.randn(d_in, generator=g, dtype=dtype))
    score = W0.norm(dim=0) * X.norm(dim=1)
    keep = torch.sort(torch.topk(score, k).indices).values
    return W0, X @ X.mT, X.mean(1), keep, X


def make_oproj(n_heads=6, n_kv=3, hd=8, d_model=48, prune_groups=1, n_tokens=600, seed=0, dtype=torch.float64):
    """o_proj-like problem: W0 (d_model, n_heads*hd), keep = whole KV groups, value_proj (k, d_model)
    = pruned v_proj rows repeated for the query heads of each kept KV head."""
    g = torch.Generator().manual_seed(seed)
    d_in = n_heads * hd
    per = n_heads // n_kv
    v = torch.randn(n_kv * hd, d_model, generator=g, dtype=dtype) / math.sqrt(d_model)
    # attention output ~ mixtures of value rows: correlated within a KV group
    H = torch.randn(d_model, n_tokens, generator=g, dtype=dtype)
    X = torch.cat([v[(h // per) * hd : (h // per + 1) * hd] @ H for h in range(n_heads)])
    X += 0.3 * torch.randn(d_in, n_tokens, generator=g, dtype=dtype)
    W0 = torch.randn(d_model, d_in, generator=g, dtype=dtype) / math.sqrt(d_in)
    W0 = W0 @ (torch.eye(d_in, dtype=dtype) + 0.5 * torch.randn(d_in, d_in, generator=g, dtype=dtype) / math.sqrt(d_in))
    group = d_in // n_kv
    kept_groups = list(range(prune_groups, n_kv))
    keep = torch.cat([torch.arange(gi * group, (gi + 1) * group) for gi in kept_groups])
    vp = torch.cat([v[gi * hd : (gi + 1) * hd].repeat(per, 1) for gi in kept_groups])
    return W0, X @ X.mT, X.mean(1), keep, vp


@pytest.mark.parametrize("shape", [(24, 40, 28), (40, 30, 20)])
def test_problem_generator_is_sane(shape):
    W0, G, mean, keep, X = make_problem(*shape)
    assert W0.shape == shape[:2] and G.shape == (shape[1], shape[1]) and keep.numel() == shape[2]
    assert bool((keep[1:] > keep[:-1]).all())
    assert float(torch.linalg.eigvalsh(G).min()) > -1e-8 * float(G.diagonal().max())
    W0, G, mean, keep, vp = make_oproj()
    assert vp.shape[0] == keep.numel() and G.shape[0] == W0.shape[1]
