"""Relative reconstruction errors of a pruned module (paper Sec. 3.1).

Conventions: ``G`` is a calibration Gram ``sum_t x_t x_t^T`` (or its mean), ``Gxx = G[K, K]``,
``Gyx = W0 G[:, K]`` and ``c = ||Y||^2 = tr(W0 G W0^T)``.

Two forms of the same errors: :func:`residual_errors` forms the residual's own quadratic form
(``tr(R G R^T)``, R = W0 - [W on K]), which for a weight that keeps ``W0[:, K]`` needs only the
pruned block ``G[P, P]`` besides ``c`` and cannot go below 0 on a PSD metric: the errors every
method without its own report (``compensate``). :class:`OutputError` expands the square
(``q - 2 p + c``) once for many candidate weights of one module (blend's held-out error).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch


def relerr(W: torch.Tensor, Gxx: torch.Tensor, Gyx: torch.Tensor, c: float) -> float:
    """Relative reconstruction error (paper Sec. 3.1):
    ``(tr(W Gxx W^T) - 2 tr(W Gyx^T) + c) / c``. W, Gyx (d_out, k); Gxx (k, k); returns a float.
    """
    W = W.to(Gxx.dtype)
    q = float(((W @ Gxx) * W).sum())
    p = float((W * Gyx).sum())
    return (q - 2.0 * p + c) / c if c > 0 else float("nan")


class OutputError:
    """Relative output error of a pruned module with a bias (paper Sec. 3.1):
    ``E||W0 x - W x_K - b||^2 / E||W0 x||^2``, with everything that does not depend on (W, b)
    formed once (one (d_out, d_in, d_in) product), so each error after it costs a (d_out, k, k)
    product.

    W0 (d_out, d_in), G (d_in, d_in) a Gram in any positive scale (PSD-projected if it was
    indefinite), keep (k,). A bias needs the channel means ``mean`` = E[x] (d_in,) and ``scale``
    with ``E[x x^T] = scale * G`` (1 for a mean Gram); the error of ``y ~ W x_K + b`` then is
    ``(scale (q - 2 p + c) - 2 b^T (W0 m - W m_K) + ||b||^2) / (scale c)``. Computed in G's dtype.
    """

    def __init__(
        self,
        W0: torch.Tensor,
        G: torch.Tensor,
        keep: torch.Tensor,
        mean: torch.Tensor | None = None,
        scale: float | None = None,
    ):
        dt = G.dtype
        W0 = W0.to(dt)
        WG = W0 @ G
        self.dtype, self.keep = dt, keep
        self.Gxx, self.Gyx, self.c = G[keep[:, None], keep], WG[:, keep], float((WG * W0).sum())
        self.scale = scale
        self.mean_k = mean.to(dt)[keep] if mean is not None else None
        self.W0m = W0 @ mean.to(dt) if mean is not None else None

    def __call__(self, W: torch.Tensor, b: torch.Tensor | None = None) -> float:
        """The error of ``W`` (d_out, k) and bias ``b`` (d_out,) or None."""
        if b is None:
            return relerr(W, self.Gxx, self.Gyx, self.c)
        if self.mean_k is None or self.W0m is None or self.scale is None:
            raise ValueError(
                "the error of a module with a bias needs the channel means and the Gram's scale (its token count)"
            )
        if not self.c > 0:
            return float("nan")
        W, b = W.to(self.dtype), b.to(self.dtype)
        sc = float(self.scale) * self.c
        err = relerr(W, self.Gxx, self.Gyx, self.c) * sc
        err += -2.0 * float(b @ (self.W0m - W @ self.mean_k)) + float(b @ b)
        return err / sc


#: Columns of G converted to float64 at a time by ``output_energy``.
ENERGY_BLOCK = 2048


def output_energy(W0: torch.Tensor, G: torch.Tensor, block: int = ENERGY_BLOCK) -> float:
    """``c = tr(W0 G W0^T)`` in float64 (W0 (d_out, d_in), G (d_in, d_in) in any float dtype),
    over blocks of ``block`` columns of G: no float64 copy of the whole Gram."""
    W = W0.to(torch.float64)
    c = 0.0
    for j in range(0, G.shape[1], block):
        cols = G[:, j : j + block].to(torch.float64)
        c += float(((W @ cols) * W[:, j : j + block]).sum())
    return c


@dataclass(frozen=True)
class MetricParts:
    """What ``residual_errors`` needs of a metric G (d_in, d_in) it is not given whole: the output
    energy ``tr(W0 G W0^T)``, a function giving the block ``G[idx][:, idx]`` of ascending column
    indices (called with the pruned columns P) and one that forms the whole G, called only for a
    weight other than ``W0[:, K]`` (``Problem.energy`` / ``metric_block`` / ``metric``: with the
    calibration's Gram check, none and bias never form it)."""

    energy: float
    block: Callable[[torch.Tensor], torch.Tensor]
    whole: Callable[[], torch.Tensor]


@dataclass(frozen=True)
class Moments:
    """What the error of a bias needs beside the Gram: the channel means E[x] (d_in,) and the
    token count N the Gram sums over (each None when unknown)."""

    mean: torch.Tensor | None
    n_tokens: float | None


def residual_errors(
    W0: torch.Tensor,
    G: torch.Tensor | MetricParts,
    keep: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    moments: Moments | None = None,
) -> dict[str, float]:
    """The errors of a pruned module from its residual (paper Sec. 3.1), in float64.

    W0 (d_out, d_in), G (d_in, d_in) the Gram ``sum_t x_t x_t^T`` over ``moments.n_tokens`` tokens
    (its symmetric part counts), keep (k,), weight (d_out, k), bias (d_out,) or None,
    ``moments.mean`` (d_in,) the channel means E[x] (needed with a bias). The residual
    ``W0 x - W x_K - b = R x - b`` with ``R[:, P] = W0[:, P]``, ``R[:, K] = W0[:, K] - W``; its
    error relative to ``c = E||W0 x||^2``: ``(tr(R G R^T) / N - 2 b^T R m + ||b||^2) / (c / N)``.

    Returns ``relerr_before`` (``W0[:, K]``: ``tr(W0_P G_PP W0_P^T) / c``), ``relerr_after`` (the
    module as given, with its bias) and, with a bias, ``relerr_after_weight_only``. Cost: ``c``
    (one ``d_out d_in^2`` product) and, for a weight equal to ``W0[:, K]``, the pruned block
    ``d_out |P|^2``; another weight adds one ``d_out d_in^2`` product. G may be given as its
    parts (:class:`MetricParts`): then ``c`` and ``G[P, P]`` are taken from them.
    """
    dev = W0.device
    W0 = W0.to(torch.float64)
    keep = keep.to(dev)
    pruned = torch.ones(W0.shape[1], dtype=torch.bool, device=dev)
    pruned[keep] = False
    P = pruned.nonzero().squeeze(1)
    c = G.energy if isinstance(G, MetricParts) else output_energy(W0, G)
    if not c > 0:
        nan = float("nan")
        return {
            "relerr_before": nan,
            "relerr_after": nan,
            **({"relerr_after_weight_only": nan} if bias is not None else {}),
        }
    WP = W0[:, P]
    GPP = G.block(P) if isinstance(G, MetricParts) else G[P[:, None], P]
    e_before = float(((WP @ GPP.to(torch.float64)) * WP).sum())
    W = weight.to(dev, torch.float64)
    if torch.equal(W, W0[:, keep]):
        R, e_weight = None, e_before
    else:
        R = W0.clone()
        R[:, keep] -= W
        e_weight = output_energy(R, G.whole() if isinstance(G, MetricParts) else G)
    out = {"relerr_before": e_before / c, "relerr_after": e_weight / c}
    if bias is None:
        return out
    mean, n_tokens = (moments.mean, moments.n_tokens) if moments is not None else (None, None)
    if mean is None or n_tokens is None:
        raise ValueError("the error of a module with a bias needs the channel means and the Gram's token count")
    b, m = bias.to(dev, torch.float64), mean.to(dev, torch.float64)
    Rm = WP @ m[P] if R is None else R @ m
    n = float(n_tokens)
    out["relerr_after_weight_only"] = out["relerr_after"]
    out["relerr_after"] = (e_weight / n - 2.0 * float(b @ Rm) + float(b @ b)) / (c / n)
    return out
