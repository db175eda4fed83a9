"""Right-rotation solvers (paper Sec. 4.1, 4.2, App. B).

Reduced Stiefel reading (docs/design.md): with the thin SVD of the current weight
``W = U diag(S) Vt`` (r = min(d_out, k) modes), ``W Q_r = U diag(S) R`` with
``R = Vt Q_r in St(r, k)`` (rows orthonormal, ``R R^T = I_r``). The right solve minimises the
profiled objective ``F(R) = min_s err(s U S R) + lambda_a A(R)`` (``objective.py``) with the
optimal global scale recomputed after every step (Sec. 4.1), by the backtracking descent of
``descent.py`` (steps, step cap, stop, precision of the direction, carried ``R Gxx``).

Retraction (``retraction.py``): Newton–Schulz polar when r < k, Cayley (inverse by
Newton–Schulz, App. B, or by an LU solve: ``cayley_inverse``) when r = k. The full solver
(``solve_full``, an ablation) moves ``Q_r in O(k)`` by Cayley steps.

    problem = RightProblem(Gxx, Gyx, c, lam_max)          # fixed across a module's rounds
    res = solve_reduced(U, S, Vt, problem, RightSolveSettings(delta=1e-6))
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from coec.compensate.alignment import Alignment
from coec.compensate.descent import Carried, Direction, RightResult, RightSolveSettings, Tangent, descend, finish
from coec.compensate.objective import AlignmentTerm, ProfiledObjective
from coec.compensate.retraction import retract_cayley, retract_polar, retract_polar_with, riemannian_grad


def make_preconditioner(Gxx: torch.Tensor, damping: float) -> torch.Tensor:
    """``(Gxx + mu I)^-1`` (k, k), ``mu = damping * mean(diag Gxx)``, by a float64 Cholesky
    factorisation (once per module: Gxx is fixed across rounds), returned in Gxx's dtype."""
    G = Gxx.to(torch.float64)
    k = G.shape[0]
    mu = float(damping) * float(G.diagonal().mean())
    eye = torch.eye(k, dtype=G.dtype, device=G.device)
    L = torch.linalg.cholesky(0.5 * (G + G.mT) + mu * eye)
    return torch.cholesky_inverse(L).to(Gxx.dtype)


@dataclass(frozen=True)
class Preconditioner:
    """The metric of a preconditioned right solve (beyond the paper): ``inv`` = M^-1 (k, k),
    ``M ~ Gxx`` SPD (``make_preconditioner``); ``rows``: with a value, the rows are also divided
    by ``D = S^2 + rows * max(S^2)`` (the Newton direction at fixed scale); None: D = I."""

    inv: torch.Tensor
    rows: float | None = None


@dataclass(frozen=True)
class RightProblem:
    """The data of a module's right solves, fixed across its rounds: Gxx (k, k), Gyx (d_out, k),
    c = ||Y||^2 in the same metric, ``lam_max`` >= lambda_max(Gxx) (the step unit
    where the Rayleigh step finds no curvature); the alignment term ``align_lambda * A(R)`` (``align`` None: no
    term) and the preconditioner of the reduced solve (None: the Riemannian gradient)."""

    Gxx: torch.Tensor
    Gyx: torch.Tensor
    c: float
    lam_max: float
    align: Alignment | None = None
    align_lambda: float = 0.0
    preconditioner: Preconditioner | None = None

    def objective(self, U: torch.Tensor, S: torch.Tensor) -> ProfiledObjective:
        """The profiled objective at the left factors U (d_out, r), S (r,)."""
        term = AlignmentTerm(self.align, self.align_lambda) if self.align is not None else None
        return ProfiledObjective(U, S, self.Gxx, self.Gyx, self.c, term)


def _lipschitz(S: torch.Tensor, lam_max: float, c: float) -> float:
    """``L0 = 2 S_max^2 lambda_max(Gxx) / c``: curvature bound of the unscaled error in R."""
    return 2.0 * float(S.max()) ** 2 * float(lam_max) / c if c > 0 else 0.0


# --------------------------------------------------------------------------- directions


class PolarDirection:
    """Direction g (r, k), tangent at R (r < k): ``step(t) = polar(R - t g)``, velocity g; it
    carries ``R Gxx`` through the step (``retract_polar_with``)."""

    carries = True

    def __init__(self, R: torch.Tensor, g: torch.Tensor):
        self.R, self.g = R, g
        self.norm = float(torch.linalg.matrix_norm(g))
        self.vel = g

    def step(self, t: float) -> torch.Tensor:
        return retract_polar(self.R, t * self.g)

    def step_carrying(self, t: float, RG: torch.Tensor, gG: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        return retract_polar_with(self.R, t * self.g, RG, t * gG)


class CayleyDirection:
    """Skew generator A (n, n) at X (n, m) (the frame R when square, or the full solver's Q):
    ``step(t) = cay(t A) X``; ``vel`` its velocity in R (given by the solver)."""

    carries = False

    def __init__(self, X: torch.Tensor, A: torch.Tensor, vel: torch.Tensor, inverse: str):
        self.X, self.A, self.inverse = X, A, inverse
        self.norm = float(torch.linalg.matrix_norm(A))
        self.vel = vel

    def step(self, t: float) -> torch.Tensor:
        return retract_cayley(self.X, self.A, t, self.inverse)

    def step_carrying(self, t: float, RG: torch.Tensor, gG: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        raise NotImplementedError("a Cayley step does not carry R Gxx")


class PolarTangent:
    """Tangent space at R (r < k): directions are tangent (r, k) matrices; the vector transport
    is the orthogonal projection onto the tangent space at R."""

    def __init__(self, R: torch.Tensor, grad: torch.Tensor, pgrad: torch.Tensor | None):
        self.R, self.grad, self.pgrad = R, grad, pgrad

    def along(self, P: torch.Tensor) -> Direction:
        return PolarDirection(self.R, P)

    def transport(self, P: torch.Tensor) -> torch.Tensor:
        return riemannian_grad(self.R, P)


class CayleyTangent:
    """Tangent space at a square R (r = k): directions are skew generators P (velocity P R), so
    they need no transport."""

    def __init__(self, R: torch.Tensor, grad: torch.Tensor, pgrad: torch.Tensor | None, inverse: str):
        self.R, self.grad, self.pgrad, self.inverse = R, grad, pgrad, inverse

    def along(self, P: torch.Tensor) -> Direction:
        return CayleyDirection(self.R, P, P @ self.R, self.inverse)

    def transport(self, P: torch.Tensor) -> torch.Tensor:
        return P


class _ReducedSpace:
    """The reduced solve's variable: R itself. The gradient's tangent image: ``riemannian_grad``
    (r < k) or the skew part ``A = skew(Xi R^T)`` (r = k: grad = A R); with a preconditioner also
    that of ``D^-1 Xi M^-1`` (``solve_reduced``)."""

    def __init__(self, S: torch.Tensor, problem: RightProblem, square: bool, inverse: str):
        self.square, self.inverse = square, inverse
        self.pre = problem.preconditioner
        self.row_w = None
        if self.pre is not None and self.pre.rows is not None:
            S2 = (S * S).to(problem.Gxx.dtype)
            self.row_w = (1.0 / (S2 + float(self.pre.rows) * float(S2.max())))[:, None]

    def _precondition(self, Xi: torch.Tensor, inv: torch.Tensor) -> torch.Tensor:
        Z = Xi if self.row_w is None else Xi * self.row_w
        return Z @ inv

    def measure(self, x: torch.Tensor) -> torch.Tensor:
        return x

    def tangent(self, x: torch.Tensor, R: torch.Tensor, Xi: torch.Tensor) -> Tangent:
        if self.square:
            B = Xi @ R.mT
            A = 0.5 * (B - B.mT)  # skew part: grad = A R
            pgrad = None
            if self.pre is not None:
                Bp = self._precondition(Xi, self.pre.inv) @ R.mT
                pgrad = 0.5 * (Bp - Bp.mT)
            return CayleyTangent(R, A, pgrad, self.inverse)
        g = riemannian_grad(R, Xi)
        pg = None if self.pre is None else riemannian_grad(R, self._precondition(Xi, self.pre.inv))
        return PolarTangent(R, g, pg)


def solve_reduced(
    U: torch.Tensor,
    S: torch.Tensor,
    Vt: torch.Tensor,
    problem: RightProblem,
    settings: RightSolveSettings | None = None,
    carried: Carried | None = None,
) -> RightResult:
    """ReducedStiefelSolve (Alg. 1 line 6, Sec. 4.2): minimise F(R) over St(r, k) from ``R = Vt``.

    U (d_out, r), S (r,), Vt (r, k) the thin SVD of the current weight (S descending); the
    metric, alignment term and preconditioner in ``problem``; ``settings`` (None: the defaults).
    Polar retraction when r < k, Cayley when r = k.

    ``settings.rg_update``: how a trial's ``R_new Gxx`` is formed for its evaluation. "product":
    one (r, k, k) product per trial. "carry" (polar retraction only):
    ``R_new Gxx = F (R Gxx - t g Gxx)`` through the retraction's left factor F
    (``retract_polar_with``), from the ``g Gxx`` of the step size: a scaling, or an (r, r, k)
    product when F needs a Newton–Schulz update. Equal in exact arithmetic; in floating point the
    carried product drifts from a fresh one by round-off, so after ``rg_refresh`` carried updates
    (0: never) it is formed afresh. ``carried``: ``Vt Gxx`` when the caller has it and the
    carried updates it has been through (the solver returns its own in ``RightResult.rg_age``).

    Preconditioning (beyond the paper): with ``problem.preconditioner`` (M^-1, ``M ~ Gxx`` SPD),
    the search direction is the tangent image of ``D^-1 Xi M^-1``, the Euclidean Newton
    direction of the error at fixed scale (its Hessian is ``S^2 (x) Gxx``,
    ``make_preconditioner``), with ``D = S^2 + rows * max(S^2)`` (``rows`` None: D = I). A
    direction that is no descent direction falls back to the gradient (counted in ``restarts``).
    Steps then need ``eta_scale="rayleigh"``, the exact line search along the direction.
    """
    settings = settings or RightSolveSettings()
    obj = problem.objective(U, S)
    r, k = Vt.shape
    square = r == k
    space = _ReducedSpace(S, problem, square, settings.cayley_inverse)
    d = descend(obj, space, settings, _lipschitz(S, problem.lam_max, problem.c), Vt, carried)
    return finish(obj, d, drifts=square)


class _FullTangent:
    """Tangent space of the full solver at Q: the canonical direction ``skew(Xi_Q Q^T) Q``, with
    velocity ``Vt A Q`` in R (no conjugate directions)."""

    def __init__(self, Q: torch.Tensor, grad: torch.Tensor, Vt: torch.Tensor, inverse: str):
        self.Q, self.grad, self.Vt, self.inverse = Q, grad, Vt, inverse
        self.pgrad: torch.Tensor | None = None

    def along(self, P: torch.Tensor) -> Direction:
        return CayleyDirection(self.Q, P, self.Vt @ (P @ self.Q), self.inverse)

    def transport(self, P: torch.Tensor) -> torch.Tensor:
        return P


class _FullSpace:
    """The full solver's variable Q in O(k), ``R = Vt Q``; the Euclidean gradient in Q is
    ``Vt^T Xi_R``."""

    def __init__(self, Vt: torch.Tensor, inverse: str):
        self.Vt, self.inverse = Vt, inverse

    def measure(self, x: torch.Tensor) -> torch.Tensor:
        return self.Vt @ x

    def tangent(self, x: torch.Tensor, R: torch.Tensor, Xi: torch.Tensor) -> Tangent:
        XQ = self.Vt.mT @ Xi
        B = XQ @ x.mT
        return _FullTangent(x, 0.5 * (B - B.mT), self.Vt, self.inverse)


def solve_full(
    U: torch.Tensor,
    S: torch.Tensor,
    Vt: torch.Tensor,
    problem: RightProblem,
    settings: RightSolveSettings | None = None,
    carried: Carried | None = None,
) -> RightResult:
    """Full right solve over ``Q_r in O(k)`` from ``Q = I`` with Cayley steps (ablation "converged
    two-sided rotation"; Sec. 4.1). Same objective as ``solve_reduced`` through ``R = Vt Q``; the
    Euclidean gradient is ``Vt^T Xi_R`` and the canonical direction ``skew(Xi_Q Q^T) Q``. Costs
    O(k^3) per step; takes gradient steps (``settings.right_solver`` does not apply) and no
    preconditioner, and ``rg_update`` does not apply (every trial forms ``R Gxx``). Returns
    R = Vt Q and Q.
    """
    if problem.preconditioner is not None:
        raise ValueError("the full right solve takes no preconditioner (right: stiefel only)")
    settings = settings or RightSolveSettings()
    obj = problem.objective(U, S)
    k = Vt.shape[1]
    Q0 = torch.eye(k, dtype=Vt.dtype, device=Vt.device)
    space = _FullSpace(Vt, settings.cayley_inverse)
    gd = replace(settings, right_solver="gd")
    d = descend(obj, space, gd, _lipschitz(S, problem.lam_max, problem.c), Q0, carried)
    return finish(obj, d, Q=d.x)
