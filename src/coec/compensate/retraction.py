"""Riemannian gradient and retractions on the Stiefel manifold St(r, k) of row-orthonormal frames
(paper Sec. 4.2, App. B): the Newton–Schulz polar retraction (r < k) and the Cayley retraction
(square frames, and the full solver's Q in O(k))."""

from __future__ import annotations

import torch

from coec.compensate.newton_schulz import ns_inverse, ns_polar_with
from coec.compensate.profiling import span, traced


def riemannian_grad(R: torch.Tensor, Xi: torch.Tensor) -> torch.Tensor:
    """Riemannian gradient on St(r, k) (rows orthonormal), embedded metric: ``Xi - sym(Xi R^T) R``."""
    B = Xi @ R.mT
    return Xi - 0.5 * (B + B.mT) @ R


@traced("coec.right.retract")
def retract_polar(R: torch.Tensor, D: torch.Tensor) -> torch.Tensor:
    """Newton–Schulz polar retraction ``polar(R - D)`` for R (r, k), r <= k, D tangent (App. B).

    For tangent D, ``(R - D)(R - D)^T = I + D D^T`` has its spectrum in ``[1, 1 + ||D||_F^2]``,
    inside the Newton–Schulz convergence region (0, 3) without rescaling when ``||D||_F <= 1``
    (the step cap); larger D is rescaled.
    """
    return retract_polar_with(R, D)[0]


@traced("coec.right.retract")
def retract_polar_with(
    R: torch.Tensor, D: torch.Tensor, RG: torch.Tensor | None = None, DG: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``retract_polar`` that also carries ``R Gxx`` through the step: given ``RG = R Gxx`` and
    ``DG = D Gxx`` (r, k), returns ``(R_new, R_new Gxx)`` with ``R_new Gxx = F (RG - DG)``, F the
    retraction's left factor (``newton_schulz.ns_polar_with``): no (r, k, k) product. R_new is
    ``retract_polar``'s, bit for bit. Without RG (or DG) the second value is None.
    """
    X = R - D
    bound = 1.0 + float((D * D).sum())
    Y = None if RG is None or DG is None else RG - DG
    out = ns_polar_with(X, Y, scale=1.0 if bound < 2.5 else bound)
    return out.P, out.PY


@traced("coec.right.retract")
def retract_cayley(R: torch.Tensor, A: torch.Tensor, t: float, inverse: str = "newton_schulz") -> torch.Tensor:
    """Cayley retraction ``(I + t/2 A)^{-1} (I - t/2 A) R`` for skew A (n, n) (Wen & Yin 2012).

    Its velocity at t = 0 is ``-A R``. ``inverse="newton_schulz"`` (App. B) iterates from
    ``X0 = M^T / (1 + (t/2)^2 ||A||_F^2)`` (``M^T M = I + (t/2)^2 A^T A``, so this converges);
    ``"solve"`` applies the same inverse by one LU solve (about 2.7 n^3 FLOPs against ~4 n^3 per
    Newton–Schulz iteration; same result to round-off).
    """
    h = 0.5 * t
    n = A.shape[0]
    eye = torch.eye(n, dtype=A.dtype, device=A.device)
    M = eye + h * A
    rhs = (eye - h * A) @ R
    if inverse == "solve":
        solved: torch.Tensor = torch.linalg.solve(M, rhs)
        return solved
    if inverse != "newton_schulz":
        raise ValueError(f"cayley inverse must be 'newton_schulz' or 'solve', got {inverse!r}")
    with span("coec.right.retract.ns_inverse"):
        Minv, _ = ns_inverse(M, M.mT / (1.0 + h * h * float((A * A).sum())))
    return Minv @ rhs
