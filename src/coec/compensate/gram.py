"""The calibration Gram as a metric (paper Sec. 3.1, 4.4, App. B): normalisation to unit mean
diagonal, spectral tempering ``G^alpha``, the PSD check and projection, and its largest
eigenvalue by power iteration.

``G`` is ``sum_t x_t x_t^T`` (or its mean); every compensation objective is invariant to a
positive scaling of it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from coec.compensate.linalg import cholesky_in_place, eigh


def gram_scale(G: torch.Tensor) -> float:
    """The factor ``normalize_gram_`` divides G (d, d) by: ``tr(G) / d`` summed in float64 (any
    dtype of G), or 1 for a zero or non-finite trace (then G is left unscaled)."""
    t = float(torch.diagonal(G).sum(dtype=torch.float64)) / G.shape[0]
    return t if t > 0 and math.isfinite(t) else 1.0


#: Rows/columns per block of ``symmetrize_`` (a block pair's temporary: 2 x 1024^2 values).
SYM_BLOCK = 1024


def symmetrize_(G: torch.Tensor, block: int = SYM_BLOCK) -> torch.Tensor:
    """``G <- 0.5 (G + G^T)`` in place, G (d, d); returns G.

    The same bits as ``0.5 * (G + G.mT)`` (IEEE addition commutes, so entries (i, j) and (j, i)
    get the same sum) with one (block, block) temporary instead of two (d, d) copies: at
    d_ff = 14336 in float64 that is 1.5 GiB less at the compensation job's peak.
    """
    d = G.shape[0]
    for i in range(0, d, block):
        for j in range(i, d, block):
            upper, lower = G[i : i + block, j : j + block], G[j : j + block, i : i + block]
            s = torch.add(upper, lower.mT).mul_(0.5)
            upper.copy_(s)
            lower.copy_(s.mT)
    return G


def normalize_gram_(G: torch.Tensor) -> torch.Tensor:
    """``G / (tr(G) / d)`` after symmetrising, in place (G (d, d) is overwritten and returned),
    so a sum and a mean Gram give the same matrix.

    Every compensation objective is invariant to a positive scaling of G; this only removes the
    N-dependence from the floating-point path. A zero or non-finite trace leaves G symmetrised,
    unscaled.
    """
    G = symmetrize_(G)
    t = float(torch.diagonal(G).sum()) / G.shape[0]
    return G.div_(t) if t > 0 and math.isfinite(t) else G


@dataclass(frozen=True)
class Tempered:
    """``temper_gram``'s result: the tempered Gram ``G`` (d, d); ``lambda_max`` of it;
    ``n_negative`` eigenvalues clipped; ``min_eig`` / ``max_eig`` of the input before clipping
    (nan / None when no eigendecomposition was needed: alpha = 1 without clipping)."""

    G: torch.Tensor
    lambda_max: float
    n_negative: int
    min_eig: float
    max_eig: float | None = None


def temper_gram(
    G: torch.Tensor, alpha: float, clip: bool = True, record: list[str] | None = None, overwrite: bool = False
) -> Tempered:
    """Spectral tempering ``G^alpha = E diag(mu^alpha) E^T`` of the FULL Gram (paper Sec. 4.4, eq. G^alpha).

    G (d, d) symmetric. Negative eigenvalues (round-off, or an indefinite estimate) are clipped to
    0 before the power when ``clip`` (always for alpha < 1: mu^alpha is undefined for mu < 0).
    Clipping matters even at alpha = 1: an indefinite metric makes the two-sided objective
    unbounded below (docs/design.md). The eigh falls back to float64 on the CPU (``eigh``, recorded in
    ``record``). ``overwrite``: G may be overwritten by the decomposition (``linalg.eigh_overwrites``).
    """
    if alpha == 1.0 and not clip:
        lam = power_max_eig(G)
        return Tempered(G=G, lambda_max=lam, n_negative=0, min_eig=float("nan"))
    mu, E = eigh(G, record, overwrite=overwrite)
    n_neg = int((mu < 0).sum())
    min_eig = float(mu.min())
    max_eig = float(mu.max())
    mu = mu.clamp_min(0.0)
    mu_a = mu if alpha == 1.0 else mu.pow(alpha)
    Ga = symmetrize_((E * mu_a) @ E.mT)
    return Tempered(G=Ga, lambda_max=float(mu_a.max()), n_negative=n_neg, min_eig=min_eig, max_eig=max_eig)


#: A Gram is treated as indefinite when an eigenvalue is below -PSD_TOL * lambda_max: far beyond
#: the round-off of a float32-accumulated Gram, which is left exactly as it is.
PSD_TOL = 1e-4


def psd_project(G: torch.Tensor, record: list[str] | None = None) -> tuple[torch.Tensor, dict[str, Any]]:
    """The nearest PSD matrix ``E diag(max(mu, 0)) E^T`` of a symmetric G (App. B: clip negative
    eigenvalues), with ``{"min_eig", "max_eig", "clipped"}`` (eigenvalues set to 0)."""
    mu, E = eigh(G, record)
    info = {"min_eig": float(mu.min()), "max_eig": float(mu.max()), "clipped": int((mu < 0).sum())}
    return symmetrize_((E * mu.clamp_min(0.0)) @ E.mT), info


PSD_ACTION = (
    "clipped negative eigenvalues to 0 (App. B): the solves and every reported error "
    "(relerr_*) use this PSD projection of the Gram"
)


def gram_psd(
    G: torch.Tensor,
    record: list[str] | None = None,
    tol: float = PSD_TOL,
    min_eig: float | None = None,
    max_eig: float | None = None,
) -> tuple[torch.Tensor, dict[str, Any]]:
    """(G, info) for a Gram that is PSD up to ``tol * lambda_max``, else (its PSD projection, info).

    The test is a Cholesky of ``G + tol lambda_max I`` (lambda_max by power iteration), or the
    given extreme eigenvalues; an eigh decides only when the Cholesky fails. info (goes into the
    result's ``info["gram_psd"]``): ``indefinite`` and, when the eigenvalues were computed,
    ``min_eig`` / ``max_eig`` / ``clipped`` / ``action``.
    """
    if min_eig is None or max_eig is None or not (math.isfinite(min_eig) and math.isfinite(max_eig)):
        lam = power_max_eig(G)
        shifted = G.clone()
        shifted.diagonal().add_(tol * max(lam, 0.0))  # G + tol lambda_max I
        positive = cholesky_in_place(shifted)  # no (d, d) factor beside G and its shifted copy
        del shifted
        if positive:
            return G, {"indefinite": False}
    elif min_eig >= -tol * max(max_eig, 0.0):
        return G, {"indefinite": False, "min_eig": min_eig, "max_eig": max_eig}
    Gp, info = psd_project(G, record)
    if info["min_eig"] >= -tol * max(info["max_eig"], 0.0):
        return G, {"indefinite": False, **{k: info[k] for k in ("min_eig", "max_eig")}}
    return Gp, {"indefinite": True, **info, "action": PSD_ACTION}


def power_max_eig(A: torch.Tensor, iters: int = 30) -> float:
    """Largest |eigenvalue| of a symmetric A (n, n) by deterministic power iteration (lower bound)."""
    n = A.shape[0]
    v = torch.ones(n, dtype=A.dtype, device=A.device) / math.sqrt(n)
    lam = 0.0
    for _ in range(iters):
        w = A @ v
        nw = float(torch.linalg.vector_norm(w))
        if nw == 0.0 or not math.isfinite(nw):
            return max(lam, 0.0)
        lam = nw
        v = w / nw
    return lam
