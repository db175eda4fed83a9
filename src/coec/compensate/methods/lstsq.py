"""lstsq: the ridge refit of the kept columns (paper Sec. 3.2), ``Gyx (Gxx + lambda I)^-1``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from coec.compensate.methods import METHODS
from coec.compensate.methods.base import CommonOptions, Compensation, Method
from coec.compensate.validators import number, opt

if TYPE_CHECKING:
    import torch

    from coec.compensate.problem import Problem


@dataclass(frozen=True)
class LstsqOptions(CommonOptions):
    """lstsq: ridge refit ``Gyx (Gxx + lambda I)^-1`` (Sec. 3.2)."""

    ridge: float = opt(
        1e-2, "lambda = ridge * mean(diag(Gxx)) (Sec. 3.2)", number(0.0), "paper", "paper hyperparameter (Sec. 3.2)"
    )


def ridge_refit(W0: torch.Tensor, G: torch.Tensor, keep: torch.Tensor, ridge: float = 1e-2) -> torch.Tensor:
    """Ridge refit ``W = Gyx (Gxx + lam I)^{-1}`` with ``lam = ridge * mean(diag(Gxx))`` (Sec. 3.2).

    W0 (d_out, d_in), G (d_in, d_in), keep (k,) -> W (d_out, k) in W0's dtype. Solved in float64
    by Cholesky; if the system is not positive definite (ridge 0 on a singular or indefinite Gxx)
    the minimum-norm least-squares solution is used instead.
    """
    # deferred: keeps the job boundary torch-free
    import torch

    from coec.compensate.linalg import cholesky_in_place

    G64 = G.to(torch.float64)
    # Gyx first, and W0 in float64 only for it: the (d_in, k) slice is gone before the (k, k) ones exist
    Gyx = W0.to(torch.float64) @ G64[:, keep]
    A = shifted_gxx(G64, keep, ridge)
    if cholesky_in_place(A):  # A is now its factor L
        X = torch.cholesky_solve(Gyx.mT, A)
    else:
        X = torch.linalg.pinv(shifted_gxx(G64, keep, ridge), hermitian=True) @ Gyx.mT
    return X.mT.to(W0.dtype)


def shifted_gxx(G: torch.Tensor, keep: torch.Tensor, ridge: float) -> torch.Tensor:
    """``Gxx + lam I`` (k, k) with ``lam = ridge * mean(diag(Gxx))``, formed in place on the one
    (k, k) copy: the bits of ``Gxx + lam * eye(k)`` (``x + lam * 0.0`` is x but for -0.0 -> +0.0,
    as in that sum), without the identity or a second (k, k) matrix."""
    import torch  # deferred: keeps the job boundary torch-free

    A = G[keep[:, None], keep]
    lam = ridge * float(torch.diagonal(A).mean())
    A.add_(lam * 0.0).diagonal().add_(lam)
    return A


def solve(problem: Problem, options: LstsqOptions) -> Compensation:
    assert problem.metric is not None  # Method.needs_metric
    G = problem.metric.G.to(problem.dtype)
    W = ridge_refit(problem.W0.to(problem.dtype), G, problem.keep, float(options.ridge))
    return Compensation(weight=W, info={"ridge": float(options.ridge)})


METHOD = METHODS.register(Method(name="lstsq", options=LstsqOptions, solve=solve, doc=LstsqOptions.__doc__ or ""))
