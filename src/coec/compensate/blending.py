"""The numerics of method blend (``coec.compensate.methods.blend``, beyond the paper): a held-out
blend of a base compensation (COEC) and ridge, with an intercept.

Three parts, each a pure function (tensors in, tensors out, float64), each switchable so that the
ladder in docs/blend.md can show what it adds:

1. **Intercept** (:func:`intercept`, :func:`affine_ridge`). A linear map of the kept columns cannot
   restore a constant output offset of the pruned ones (FLAP's bias restores only that). With the
   calibration means ``m`` the best bias for a fixed ``W`` is ``b = W0 m - W m_K``
   (``d/db E||W0 x - W x_K - b||^2 = 0``); the joint optimum of ridge and bias is ridge on the
   *centred* second moments ``C = E[x x^T] - m m^T`` followed by that bias.
2. **Ridge** (``lstsq.ridge_refit`` on the Gram, or on C with the intercept).
3. **Held-out blend** (:func:`blend_weight`). ``P(beta) = (1 - beta) P_base + beta P_ridge`` with
   ``P = [W, b]``; on held-out calibration statistics ``H = E_h[x~ x~^T]`` (``x~ = [x; 1]``) the
   error is a quadratic in beta, minimised in closed form and clipped to [0, 1], so the blend is
   never worse on the held-out tokens than either end.

At the limits it is its parts: ``mix="base"`` without intercept returns the base weights
unchanged, ``mix="ridge"`` without intercept is ``lstsq`` bit for bit.
"""

from __future__ import annotations

from typing import Any, Protocol, cast

import torch

from coec.compensate.errors import OutputError
from coec.compensate.methods.base import Compensation
from coec.compensate.methods.lstsq import ridge_refit
from coec.compensate.problem import Problem


class BlendSettings(Protocol):
    """What the numerics read of the method's options (``coec.compensate.methods.blend.BlendOptions``)."""

    @property
    def mix(self) -> str: ...

    @property
    def intercept(self) -> bool: ...

    @property
    def ridge(self) -> float: ...


_End = tuple[torch.Tensor, torch.Tensor | None]  # an end of the blend: weight (d_out, k), bias (d_out,) or None


def intercept(W0: torch.Tensor, W: torch.Tensor, mean: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """The best bias for a fixed ``W``: ``b = W0 m - W m_K``. W0 (d_out, d_in), W (d_out, k),
    mean (d_in,), keep (k,) -> (d_out,)."""
    return W0 @ mean - W @ mean[keep]


def affine_ridge(
    W0: torch.Tensor, gram_mean: torch.Tensor, mean: torch.Tensor, keep: torch.Tensor, ridge: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Ridge with an intercept: ``W = C_yx (C_xx + lam I)^-1`` on the centred second moments
    ``C = E[x x^T] - m m^T`` (lam = ridge * mean diag(C_xx), as ``lstsq``), ``b = W0 m - W m_K``.
    gram_mean (d_in, d_in) is E[x x^T] (a mean, not a sum). Returns (W (d_out, k), b (d_out,))."""
    C = gram_mean - torch.outer(mean, mean)
    C = 0.5 * (C + C.mT)  # a PSD-projected gram_mean is symmetric only to round-off
    W = ridge_refit(W0, C, keep, ridge)
    return W, intercept(W0, W, mean, keep)


def augmented_gram(gram_mean: torch.Tensor, mean: torch.Tensor) -> torch.Tensor:
    """``E[x~ x~^T]`` of ``x~ = [x; 1]``: [[E x x^T, m], [m^T, 1]], (d_in + 1, d_in + 1)."""
    d = gram_mean.shape[0]
    H = gram_mean.new_empty(d + 1, d + 1)
    H[:d, :d], H[:d, d], H[d, :d], H[d, d] = gram_mean, mean, mean, 1.0
    return H


def _stack(W: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    """[W, b] (d_out, k + 1); a missing bias is 0."""
    return torch.cat([W, (b if b is not None else W.new_zeros(W.shape[0]))[:, None]], dim=1)


def blend_weight(
    W0: torch.Tensor, base: _End, ridge: _End, gram_mean: torch.Tensor, mean: torch.Tensor, keep: torch.Tensor
) -> tuple[float, dict[str, Any]]:
    """The beta in [0, 1] that minimises the held-out error of ``(1 - beta) base + beta ridge``.

    base, ridge: (W (d_out, k), b (d_out,) | None); gram_mean, mean: held-out E[x x^T], E[x].
    With D = P_ridge - P_base, Z = [W0, 0] and H = ``augmented_gram``, the error is
    ``E(beta) = E(0) - 2 beta <D, Z H[:, K~] - P_base H[K~, K~]> + beta^2 <D, D H[K~, K~]>``.
    Returns (beta, {"unclipped": the stationary point or None where D H D = 0}).
    """
    d = W0.shape[1]
    kt = torch.cat([keep, keep.new_tensor([d])])
    H = augmented_gram(gram_mean, mean)
    Hk = H[kt][:, kt]
    Pb, Pr = _stack(*base), _stack(*ridge)
    D = Pr - Pb
    Z = torch.cat([W0, W0.new_zeros(W0.shape[0], 1)], dim=1)
    num = float((D * (Z @ H[:, kt] - Pb @ Hk)).sum())
    den = float(((D @ Hk) * D).sum())
    if not den > 0:
        return 0.0, {"unclipped": None}
    beta = num / den
    return min(1.0, max(0.0, beta)), {"unclipped": beta}


def _ends(problem: Problem, o: BlendSettings, mean: torch.Tensor) -> tuple[_End, _End]:
    """The base end (the base cell's weight and bias, or the best intercept) and the ridge end
    ((W, b) of ridge on centred statistics with ``intercept``, else plain ``lstsq``), float64."""
    f64 = torch.float64
    W0c = problem.W0.to(problem.dtype)
    W0_64 = W0c.to(f64)
    Wb = problem.inputs["base_weight"].to(problem.device, f64)
    bb = problem.inputs.get("base_bias")
    bb = bb.to(problem.device, f64) if bb is not None else None
    if o.intercept:
        bb = intercept(W0_64, Wb, mean, problem.keep)
        Wr, br = affine_ridge(W0_64, problem.mean_gram(), mean, problem.keep, float(o.ridge))
    else:  # = method lstsq, bit for bit
        assert problem.metric is not None  # Method.needs_metric
        Wr, br = ridge_refit(W0c, problem.metric.G.to(problem.dtype), problem.keep, float(o.ridge)), None
    return (Wb, bb), (Wr, br)


def _heldout(problem: Problem, ends: tuple[_End, _End], info: dict[str, Any]) -> tuple[float, OutputError]:
    """beta fitted on the held-out statistics, with the ends' held-out errors in ``info``."""
    f64 = torch.float64
    W0_64 = problem.W0.to(problem.dtype).to(f64)
    Hm = problem.inputs["holdout_gram"].to(problem.device, f64) / float(problem.inputs["holdout_count"])
    Hm = 0.5 * (Hm + Hm.mT)
    hm = problem.inputs["holdout_mean"].to(problem.device, f64)
    (Wb, bb), (Wr, br) = ends
    beta, bi = blend_weight(W0_64, (Wb, bb), (Wr.to(f64), br), Hm, hm, problem.keep)
    info["beta_unclipped"] = bi["unclipped"]
    heldout = OutputError(W0_64, Hm, problem.keep, hm, scale=1.0)  # Hm is a mean Gram
    info["heldout_relerr_base"] = heldout(Wb, bb)
    info["heldout_relerr_ridge"] = heldout(Wr, br)
    return beta, heldout


def solve_blend(problem: Problem, o: BlendSettings) -> Compensation:
    """The ``blend`` method: W (d_out, k) and b (d_out,) | None, with the chosen ``beta`` and the
    held-out errors of the ends and of the blend in ``info``."""
    assert problem.mean is not None  # Method.needs_mean
    f64 = torch.float64
    dtype = problem.dtype
    ends = _ends(problem, o, problem.mean.to(problem.device, f64))
    (Wb, bb), (Wr, br) = ends
    info: dict[str, Any] = {"mix": o.mix, "intercept": bool(o.intercept), "ridge": float(o.ridge)}
    heldout = None
    beta: float | None = None
    if problem.inputs.get("holdout_gram") is not None:
        beta, heldout = _heldout(problem, ends, info)
    if o.mix == "base":
        beta = 0.0
    elif o.mix == "ridge":
        beta = 1.0
    info["beta"] = beta
    if beta == 0.0:
        W, b = Wb.to(dtype), bb
    elif beta == 1.0:
        W, b = Wr, br
    else:
        assert beta is not None  # mix holdout needs the held-out Grams (check_data)
        W = ((1.0 - beta) * Wb + beta * Wr.to(f64)).to(dtype)
        b = (
            None
            if bb is None and br is None
            else cast(
                torch.Tensor,  # one of them is a tensor
                (1.0 - beta) * (bb if bb is not None else 0.0) + beta * (br if br is not None else 0.0),
            )
        )
    if heldout is not None:
        info["heldout_relerr"] = heldout(W.to(f64), b)
    return Compensation(weight=W, bias=b.to(dtype) if b is not None else None, info=info)
