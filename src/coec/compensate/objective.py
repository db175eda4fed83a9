"""The profiled objective of a right solve (paper Sec. 4.1, 4.2, 4.5).

With the thin SVD ``W = U diag(S) Vt`` of the current weight and ``R in St(r, k)``:

    F(R) = min_s  err(s U S R) + lambda_a A(R),
    err(W) = (tr(W Gxx W^T) - 2 tr(W Gyx^T) + c) / c.

Because ``U^T U = I``, ``err(s U S R) = (s^2 q - 2 s p + c)/c`` with
``q = sum_i S_i^2 (R Gxx R^T)_ii`` and ``p = <S U^T Gyx, R>``; by the envelope theorem the
gradient at ``s = s*`` is ``Xi = (2/c) (s^2 S^2 R Gxx - s S U^T Gyx) + lambda_a dA/dR``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from coec.compensate.alignment import Alignment, alignment_grad, alignment_value
from coec.compensate.profiling import traced


@dataclass(frozen=True)
class Evaluation:
    """F at one frame R: ``F = err + lambda_a A``, the error ``err`` at the optimal scale ``s``
    (``ok``: its denominator q was positive; else s = 1), the penalty ``A`` and ``RG = R Gxx``."""

    F: float
    err: float
    A: float
    s: float
    ok: bool
    RG: torch.Tensor


@dataclass(frozen=True)
class AlignmentTerm:
    """The alignment term ``align_lambda * A(R)`` of eq. 1: the alignment data and lambda_a > 0."""

    align: Alignment
    align_lambda: float


class ProfiledObjective:
    """``F(R) = min_s err(s U S R) + lambda_a A(R)`` and its Euclidean gradient (module docstring).

    U (d_out, r), S (r,) >= 0 descending, Gxx (k, k), Gyx (d_out, k), c > 0. The scale is only
    applied when its denominator q is positive (App. B); otherwise s = 1 and ``ok`` False.
    """

    def __init__(
        self,
        U: torch.Tensor,
        S: torch.Tensor,
        Gxx: torch.Tensor,
        Gyx: torch.Tensor,
        c: float,
        term: AlignmentTerm | None = None,
    ):
        self.S = S
        self.S2 = (S * S)[:, None]
        self.P = S[:, None] * (U.mT @ Gyx)  # (r, k)
        self.Gxx = Gxx
        self.c = float(c)
        self.align = term.align if term is not None and term.align_lambda > 0 else None
        self.lam = float(term.align_lambda) if term is not None else 0.0

    @traced("coec.right.evaluate")
    def evaluate(self, R: torch.Tensor, RG: torch.Tensor | None = None) -> Evaluation:
        """F at R (r, k); ``RG`` = R Gxx when the caller has it (else one (r, k, k) product)."""
        RG = R @ self.Gxx if RG is None else RG
        q = float((self.S2 * RG * R).sum())
        p = float((self.P * R).sum())
        ok = q > 0 and math.isfinite(q)
        s = p / q if ok else 1.0
        err = (s * s * q - 2.0 * s * p + self.c) / self.c
        A = 0.0
        if self.align is not None:
            A = alignment_value(R[: self.align.rank], self.align)
        return Evaluation(F=err + self.lam * A, err=err, A=A, s=s, ok=ok, RG=RG)

    def grad(self, R: torch.Tensor, ev: Evaluation) -> torch.Tensor:
        """Euclidean gradient Xi (r, k) of F at R, from R's evaluation ``ev``."""
        s = ev.s
        Xi = (2.0 / self.c) * (s * s * self.S2 * ev.RG - s * self.P)
        if self.align is not None:
            rp = self.align.rank
            Xi[:rp] += self.lam * alignment_grad(R[:rp], self.align)
        return Xi
