"""Relative reconstruction errors of a pruned module (paper Sec. 3.1).

Conventions: ``G`` is a calibration Gram ``sum_t x_t x_t^T`` (or its mean), ``Gxx = G[K, K]``,
``Gyx = W0 G[:, K]`` and ``c = ||Y||^2 = tr(W0 G W0^T)``.
"""

from __future__ import annotations

import torch

__all__ = ["relerr", "OutputError"]


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
        self.Gxx, self.Gyx, self.c = G[keep][:, keep], WG[:, keep], float((WG * W0).sum())
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
