"""Beyond the paper: a held-out blend of a base compensation (COEC) and ridge, with an intercept.

Three parts, each a pure function (tensors in, tensors out, float64), each switchable so that the
ladder in docs/blend.md can show what it adds:

1. **Intercept** (:func:`intercept`, :func:`affine_ridge`). A linear map of the kept columns cannot
   restore a constant output offset of the pruned ones (FLAP's bias restores only that). With the
   calibration means ``m`` the best bias for a fixed ``W`` is ``b = W0 m - W m_K``
   (``d/db E||W0 x - W x_K - b||^2 = 0``); the joint optimum of ridge and bias is ridge on the
   *centred* second moments ``C = E[x x^T] - m m^T`` followed by that bias.
2. **Ridge** (``baselines.lstsq`` on the Gram, or on C with the intercept).
3. **Held-out blend** (:func:`blend_weight`). ``P(beta) = (1 - beta) P_base + beta P_ridge`` with
   ``P = [W, b]``; on held-out calibration statistics ``H = E_h[x~ x~^T]`` (``x~ = [x; 1]``) the
   error is a quadratic in beta, minimised in closed form and clipped to [0, 1], so the blend is
   never worse on the held-out tokens than either end.

At the limits it is its parts: ``mix="base"`` without intercept returns the base weights
unchanged, ``mix="ridge"`` without intercept is ``lstsq`` bit for bit.
"""

from __future__ import annotations

import torch

from .baselines import lstsq
from .linalg import OutputError

__all__ = ["intercept", "affine_ridge", "augmented_gram", "blend_weight", "blend"]


def intercept(W0: torch.Tensor, W: torch.Tensor, mean: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """The best bias for a fixed ``W``: ``b = W0 m - W m_K``. W0 (d_out, d_in), W (d_out, k),
    mean (d_in,), keep (k,) -> (d_out,)."""
    return W0 @ mean - W @ mean[keep]


def affine_ridge(W0: torch.Tensor, gram_mean: torch.Tensor, mean: torch.Tensor, keep: torch.Tensor,
                 ridge: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Ridge with an intercept: ``W = C_yx (C_xx + lam I)^-1`` on the centred second moments
    ``C = E[x x^T] - m m^T`` (lam = ridge * mean diag(C_xx), as ``lstsq``), ``b = W0 m - W m_K``.
    gram_mean (d_in, d_in) is E[x x^T] (a mean, not a sum). Returns (W (d_out, k), b (d_out,))."""
    C = gram_mean - torch.outer(mean, mean)
    C = 0.5 * (C + C.mT)  # a PSD-projected gram_mean is symmetric only to round-off
    W = lstsq(W0, C, keep, ridge)
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


def blend_weight(W0: torch.Tensor, base: tuple, ridge: tuple, gram_mean: torch.Tensor, mean: torch.Tensor,
                 keep: torch.Tensor) -> tuple[float, dict]:
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


def blend(W0: torch.Tensor, G: torch.Tensor, gram_mean: torch.Tensor, mean: torch.Tensor,
          keep: torch.Tensor, o: dict) -> tuple[torch.Tensor, torch.Tensor | None, dict]:
    """The ``blend`` method. W0 (d_out, d_in) and G (the normalised Gram) in the solve dtype;
    gram_mean (d_in, d_in) = Gram / n_tokens and mean (d_in,), float64; keep (k,); ``o`` the
    resolved options (``base_weight`` (d_out, k), ``base_bias``, ``holdout_gram`` (a sum over
    ``holdout_count`` tokens), ``holdout_mean``, ``mix``, ``intercept``, ``ridge``).
    Returns (W (d_out, k), b (d_out,) | None, info)."""
    f64 = torch.float64
    W0_64 = W0.to(f64)
    Wb = o["base_weight"].to(W0.device, f64)
    bb = o["base_bias"].to(W0.device, f64) if o["base_bias"] is not None else None
    if o["intercept"]:
        bb = intercept(W0_64, Wb, mean, keep)
        Wr, br = affine_ridge(W0_64, gram_mean, mean, keep, float(o["ridge"]))
    else:
        Wr, br = lstsq(W0, G, keep, float(o["ridge"])), None  # = method lstsq, bit for bit
    info: dict = {"mix": o["mix"], "intercept": bool(o["intercept"]), "ridge": float(o["ridge"])}
    if o["holdout_gram"] is not None:
        n_h = float(o["holdout_count"])
        Hm = o["holdout_gram"].to(W0.device, f64) / n_h
        Hm = 0.5 * (Hm + Hm.mT)
        hm = o["holdout_mean"].to(W0.device, f64)
        beta, bi = blend_weight(W0_64, (Wb, bb), (Wr.to(f64), br), Hm, hm, keep)
        info["beta_unclipped"] = bi["unclipped"]
        heldout = OutputError(W0_64, Hm, keep, hm, scale=1.0)  # Hm is a mean Gram
        info["heldout_relerr_base"] = heldout(Wb, bb)
        info["heldout_relerr_ridge"] = heldout(Wr, br)
    else:
        beta = None
    if o["mix"] == "base":
        beta = 0.0
    elif o["mix"] == "ridge":
        beta = 1.0
    info["beta"] = beta
    if beta == 0.0:
        W, b = Wb.to(W0.dtype), bb
    elif beta == 1.0:
        W, b = Wr, br
    else:
        W = (1.0 - beta) * Wb + beta * Wr.to(f64)
        b = None if bb is None and br is None else (
            (1.0 - beta) * (bb if bb is not None else 0.0) + beta * (br if br is not None else 0.0))
        W = W.to(W0.dtype)
    if o["holdout_gram"] is not None:
        info["heldout_relerr"] = heldout(W.to(f64), b)
    return W, (b.to(W0.dtype) if b is not None else None), info
