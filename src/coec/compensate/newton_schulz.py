"""Newton–Schulz iterations (paper App. B): inverse, inverse square root, the polar retraction of
a wide frame, and the orthonormalisation that refines the eigh- and Newton-based polar factors.

Matrix products only (GPU-friendly, no factorisation); each routine stops at its tolerance or at
its round-off floor.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import NamedTuple

import torch


def ns_orthonormalize(P: torch.Tensor, max_refine: int) -> tuple[torch.Tensor, float]:
    """Newton–Schulz steps ``P <- P (3I - P^T P) / 2`` on a tall P (m, n) until ``P^T P = I`` to
    1e-12 or ``max_refine`` steps. Returns (P, final max |P^T P - I|)."""
    eye = torch.eye(P.shape[1], dtype=P.dtype, device=P.device)
    err = float("inf")
    for step in range(max_refine + 1):
        PtP = P.mT @ P
        err = float((PtP - eye).abs().max())
        if not math.isfinite(err) or err < 1e-12 or step == max_refine:
            break
        P = P @ (1.5 * eye - 0.5 * PtP)
    return P, err


def ns_inverse(
    M: torch.Tensor, X0: torch.Tensor | None = None, tol: float | None = None, max_iter: int = 60
) -> tuple[torch.Tensor, int]:
    """Newton–Schulz inverse ``X_{j+1} = X_j (2I - M X_j)`` (Higham 2008; used for Cayley, App. B).

    M (n, n). ``X0`` defaults to ``M^T / (||M||_1 ||M||_inf)`` (always convergent); callers with a
    better bound pass their own. Stops when ``||I - M X||_F < tol`` (default ~ 50 eps sqrt(n)).
    Returns (X, iterations).
    """
    n = M.shape[-1]
    eye = torch.eye(n, dtype=M.dtype, device=M.device)
    if X0 is None:
        X0 = M.mT / (torch.linalg.matrix_norm(M, 1) * torch.linalg.matrix_norm(M, float("inf")))
    if tol is None:
        tol = 10.0 * torch.finfo(M.dtype).eps * math.sqrt(n)
    X = X0
    prev = float("inf")
    it = 0
    for it in range(1, max_iter + 1):
        E = eye - M @ X
        err = float(torch.linalg.matrix_norm(E))
        if err < tol or (err > 0.5 * prev and err < 1e-3):  # converged / round-off floor
            return X, it - 1
        prev = err
        X = X + X @ E
    return X, it


class InvSqrt(NamedTuple):
    """``ns_inv_sqrt``'s result: ``M^{-1/2} = Z / sqrt(scale)``, Z None when the first check
    already passed (Z = I: no update was needed)."""

    Z: torch.Tensor | None
    scale: float
    iterations: int


def ns_inv_sqrt(M: torch.Tensor, scale: float | None = None, tol: float | None = None, max_iter: int = 60) -> InvSqrt:
    """Inverse square root of an SPD matrix by the coupled Newton–Schulz iteration (Higham 2008, 6.3).

    M (n, n), SPD. With ``A = M / scale`` (eigenvalues must lie in (0, 3); default scale
    ``||M||_F``): ``T = (3I - Z Y)/2; Y <- Y T; Z <- T Z`` from ``Y = A, Z = I`` gives
    ``Z -> A^{-1/2}``. Stops when ``||T - I||_F < tol`` (default 10 eps sqrt(n)) or at the
    round-off floor. Returns (Z, scale, iterations): ``M^{-1/2} = Z / sqrt(scale)``.
    """
    n = M.shape[-1]
    eye = torch.eye(n, dtype=M.dtype, device=M.device)
    if scale is None:
        scale = float(torch.linalg.matrix_norm(M))
    if tol is None:
        tol = 10.0 * torch.finfo(M.dtype).eps * math.sqrt(n)
    Y = M / scale
    Z = None  # identity
    prev = float("inf")
    it = 0
    for it in range(1, max_iter + 1):  # noqa: B007  (it: the iterations, returned)
        T = 1.5 * eye - 0.5 * (Y if Z is None else Z @ Y)
        err = float(torch.linalg.matrix_norm(T - eye))
        if err < tol or (err > 0.5 * prev and err < 1e-2):  # converged / round-off floor
            break
        Y = Y @ T
        Z = T if Z is None else T @ Z
        prev = err
    return InvSqrt(Z, scale, it)


def ns_polar(X: torch.Tensor, scale: float | None = None, tol: float | None = None) -> tuple[torch.Tensor, int]:
    """Newton–Schulz polar retraction of a wide frame: ``(X X^T)^{-1/2} X`` (paper App. B).

    X (r, k), r <= k, full row rank. The inverse square root of the small (r, r) Gram is computed
    by the coupled Newton–Schulz iteration, so the cost is two (r, r, k) products plus O(r^3)
    per iteration instead of O(r^2 k) per iteration. ``scale`` is an upper bound on
    ``lambda_max(X X^T)`` (default ``||X X^T||_F``). When X X^T is already within the
    tolerance of ``scale I`` (most right-solve steps: ``||t g||^2`` below ~1e-4), the factor is
    ``I / sqrt(scale)`` and the (r, r, k) product with it is replaced by a scaling of X into a
    row-major result, as the product's: the same numbers, bit for bit (every other term of that
    product is an exact zero), in the same layout (a later product's rounding depends on it).
    Returns (row-orthonormal frame, iterations).
    """
    out = ns_polar_with(X, None, scale, tol)
    return out.P, out.iterations


class PolarWith(NamedTuple):
    """``ns_polar_with``'s result: the frame ``F X``, the companion ``F Y`` (None without Y), and
    the Newton–Schulz iterations."""

    P: torch.Tensor
    PY: torch.Tensor | None
    iterations: int


def ns_polar_with(
    X: torch.Tensor, Y: torch.Tensor | None, scale: float | None = None, tol: float | None = None
) -> PolarWith:
    """``ns_polar`` that also applies its left factor to a companion Y (r, m):
    returns ``(F X, F Y, iterations)`` with ``F = (X X^T)^{-1/2}`` (Y None: ``F Y`` is None).

    With ``Y = X Gxx`` this carries a frame's product with a metric through the retraction:
    ``polar(X) Gxx = F (X Gxx)``, one (r, r, m) product when F needs an update and a scaling
    when it does not, instead of the (r, k, m) product with Gxx. ``F X`` is ``ns_polar``'s
    result bit for bit.
    """
    inv = ns_inv_sqrt(X @ X.mT, scale, tol)
    apply: Callable[[torch.Tensor], torch.Tensor]
    if inv.Z is None:
        c = torch.ones((), dtype=X.dtype, device=X.device) / math.sqrt(inv.scale)  # the diagonal of I / sqrt(s)

        def apply(T: torch.Tensor) -> torch.Tensor:
            # 0 + c T, row-major: c T rounded once and -0 -> +0, as the product's sums give
            return torch.zeros(T.shape, dtype=T.dtype, device=T.device).addcmul_(T, c)
    else:
        F = inv.Z / math.sqrt(inv.scale)

        def apply(T: torch.Tensor) -> torch.Tensor:
            return F @ T

    return PolarWith(apply(X), (None if Y is None else apply(Y)), inv.iterations)
