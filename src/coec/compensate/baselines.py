"""Baseline compensations (paper Sec. 1–3; RCPU, Haruta et al. 2026; FLAP, An et al. 2023).

All functions take the (normalised) Gram ``G`` (d_in, d_in), the original weight ``W0``
(d_out, d_in) and the sorted kept indices ``keep`` (k,), in one dtype/device, and return the
compensated weight (d_out, k) (plus a bias or an info dict where relevant).
"""

from __future__ import annotations

import torch

from .linalg import polar

__all__ = ["none", "bias", "lstsq", "rcpu"]


def none(W0: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """Prune only (Wanda-sp): ``W0[:, K]``."""
    return W0[:, keep]


def bias(W0: torch.Tensor, mean: torch.Tensor, keep: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """FLAP bias compensation: weight ``W0[:, K]``, bias ``b = W0[:, P] mean[P]`` (P = pruned)."""
    mask = torch.ones(W0.shape[1], dtype=torch.bool, device=W0.device)
    mask[keep] = False
    return W0[:, keep], W0[:, mask] @ mean.to(W0.dtype)[mask]


def lstsq(W0: torch.Tensor, G: torch.Tensor, keep: torch.Tensor, ridge: float = 1e-2) -> torch.Tensor:
    """Ridge refit ``W = Gyx (Gxx + lam I)^{-1}`` with ``lam = ridge * mean(diag(Gxx))`` (Sec. 3.2).

    Solved in float64 by Cholesky; if the system is not positive definite (ridge 0 on a singular
    or indefinite Gxx) the minimum-norm least-squares solution is used instead.
    """
    G64, W64 = G.to(torch.float64), W0.to(torch.float64)
    Gxx = G64[keep][:, keep]
    Gyx = W64 @ G64[:, keep]
    lam = ridge * float(torch.diagonal(Gxx).mean())
    A = Gxx + lam * torch.eye(Gxx.shape[0], dtype=Gxx.dtype, device=Gxx.device)
    L, info = torch.linalg.cholesky_ex(A)
    if int(info) == 0:
        X = torch.cholesky_solve(Gyx.mT, L)
    else:
        X = torch.linalg.pinv(A, hermitian=True) @ Gyx.mT
    return X.mT.to(W0.dtype)


def rcpu(W0: torch.Tensor, G: torch.Tensor, keep: torch.Tensor, record: list | None = None) -> tuple[torch.Tensor, dict]:
    """RCPU: ``Q = polar(Gyx W_K^T)`` in O(d_out), ``W = Q W_K``, global scale
    ``s* = <Gyx, W> / <W, W Gxx>`` applied only when the denominator is positive (App. B).

    Returns (s* Q W_K, info with ``scale``, ``scale_ok``, ``Q``).
    """
    WK = W0[:, keep]
    Gxx = G[keep][:, keep]
    Gyx = W0 @ G[:, keep]
    Q = polar(Gyx @ WK.mT, record)
    W = Q @ WK
    num = float((Gyx * W).sum())
    den = float(((W @ Gxx) * W).sum())
    ok = den > 0
    s = num / den if ok else 1.0
    return s * W, {"scale": s, "scale_ok": ok, "Q": Q}
