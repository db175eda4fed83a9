"""Singular-value rescaling: global scale and GCV per-mode rescale (paper Sec. 4.1, 4.3, App. B).

Everything here works on the mode statistics of the current weight ``W = sum_i sigma_i u_i v_i^T``:
``rho_i = u_i^T Gyx v_i`` (mode response) and ``e_i = v_i^T Gxx v_i`` (mode energy). Because the
``u_i`` are orthonormal, the relative error separates over modes:
``err(s) = (sum_i e_i s_i^2 - 2 rho_i s_i + c) / c``, so every quantity below is closed form and
O(r). Inputs are 1-D tensors of length r; computations run in float64.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch


def global_scale(sigma: torch.Tensor, rho: torch.Tensor, e: torch.Tensor) -> tuple[float, bool]:
    """Optimal global scale ``s* = <Gyx, W> / <W, W Gxx> = sum sigma rho / sum sigma^2 e`` (Sec. 4.1).

    Returns (s*, ok). App. B safeguard: the scale is only valid when its denominator is positive;
    otherwise (1.0, False) and the caller leaves the weight unscaled.
    """
    sigma, rho, e = (t.to(torch.float64) for t in (sigma, rho, e))
    num = float((sigma * rho).sum())
    den = float((sigma * sigma * e).sum())
    if den > 0 and math.isfinite(den) and math.isfinite(num):
        return num / den, True
    return 1.0, False


def positive_modes(e: torch.Tensor) -> torch.Tensor:
    """Boolean mask of modes whose energy is positive beyond round-off.

    ``e_i > rel_eps * max|e|`` with ``rel_eps = 10 * eps(dtype of e)``: a per-mode value is only
    applied where its denominator ``e_i`` is positive (App. B); the others keep ``s* sigma_i``.
    """
    rel_eps = 10.0 * torch.finfo(e.dtype).eps
    emax = float(e.abs().max()) if e.numel() else 0.0
    return e > rel_eps * emax


def lambda_grid(e_pos: torch.Tensor, lo: float = 1e-4, hi: float = 1e5, n: int = 120) -> torch.Tensor:
    """GCV grid: ``n`` log-spaced points in ``[lo, hi] * median(e_i)`` over positive modes (App. B)."""
    med = float(e_pos.median())
    return torch.logspace(math.log10(lo), math.log10(hi), n, dtype=torch.float64, device=e_pos.device) * med


def per_mode_scale(
    lam: torch.Tensor | float, sigma: torch.Tensor, rho: torch.Tensor, e: torch.Tensor, s_glob: float
) -> torch.Tensor:
    """Regularised singular values ``s_i(lam) = (rho_i + lam s* sigma_i) / (e_i + lam)`` (Sec. 4.3).

    ``lam`` scalar or (L,) -> (r,) or (L, r). lam -> 0 gives ``rho_i / e_i`` (per-mode optimum),
    lam -> inf gives ``s* sigma_i`` (global scale). Requires ``e_i > 0``.
    """
    lam = torch.as_tensor(lam, dtype=torch.float64, device=sigma.device)
    lam = lam[..., None] if lam.ndim else lam
    return (rho + lam * s_glob * sigma) / (e + lam)


def gcv_curve(
    lams: torch.Tensor, sigma: torch.Tensor, rho: torch.Tensor, e: torch.Tensor, s_glob: float
) -> torch.Tensor:
    """``GCV(lam) = sum_i e_i (s_i(lam) - rho_i/e_i)^2 / (1 - df(lam)/M)^2``, ``df = sum e_i/(e_i+lam)``.

    Evaluated in the algebraically equal, cancellation-free form
    ``M^2 * sum_i (e_i s* sigma_i - rho_i)^2 / (e_i (e_i + lam)^2) / (sum_i 1/(e_i + lam))^2``
    (numerator and denominator of the paper's form share the factor lam^2). Positive modes only.
    Shapes: lams (L,), others (M,) -> (L,).
    """
    M = sigma.numel()
    ep = e[None, :] + lams[:, None]
    num = ((e * s_glob * sigma - rho) ** 2 / e)[None, :] / ep**2
    den = (1.0 / ep).sum(1) ** 2
    return M * M * num.sum(1) / den


def kappa_clamp(values: torch.Tensor, target: torch.Tensor, kappa: float | None) -> tuple[torch.Tensor, int]:
    """Clamp each value to within a factor ``kappa`` of ``target`` (App. B per-mode dose band).

    Band ``[target/kappa, target*kappa]`` (ordered for negative targets; a zero target forces 0).
    Returns (clamped, number of entries that moved). ``kappa=None`` disables the band.
    """
    if kappa is None or not math.isfinite(kappa):
        return values, 0
    a, b = target / kappa, target * kappa
    lo, hi = torch.minimum(a, b), torch.maximum(a, b)
    out = torch.minimum(torch.maximum(values, lo), hi)
    tol = 1e-12 * (target.abs() + values.abs())
    return out, int(((out - values).abs() > tol).sum())


@dataclass(frozen=True)
class Rescaled:
    """``rescale``'s result: the new singular values ``sigma`` (r,) float64; the global scale
    ``s_glob`` and whether it applied (``scale_ok``). For GCV also ``lam`` (None when no mode had
    positive energy), ``lam_rel`` (lam / median e), ``grid_end`` ("low" | "high" | None: the
    minimiser at an end of the grid), ``n_clamped`` (values moved by the kappa band) and
    ``n_modes`` (positive modes used); None / 0 for the global rescale."""

    sigma: torch.Tensor
    s_glob: float
    scale_ok: bool
    lam: float | None = None
    lam_rel: float | None = None
    grid_end: str | None = None
    n_clamped: int = 0
    n_modes: int = 0


def rescale(
    sigma: torch.Tensor,
    rho: torch.Tensor,
    e: torch.Tensor,
    mode: str = "gcv",
    grid: tuple[float, float, int] = (1e-4, 1e5, 120),
    kappa: float | None = 10.0,
) -> Rescaled:
    """New singular values for the fixed frames ``u_i, v_i`` (Alg. 1 "GCV-rescale", Sec. 4.3 / App. B).

    mode="global": ``s* sigma`` (Sec. 4.1). mode="gcv": per positive-energy mode ``s_i(lam_hat)``
    with ``lam_hat`` the GCV minimiser over ``grid`` (first one on ties), clamped to the kappa band
    around ``s* sigma_i``; other modes keep ``s* sigma_i``. If the global denominator is not
    positive, s* = 1 (weight left unscaled) and this is reported. Never increases the error in the
    metric the statistics come from (each mode moves toward its own minimiser).
    """
    sigma, rho, e = (t.to(torch.float64) for t in (sigma, rho, e))
    s_glob, ok = global_scale(sigma, rho, e)
    base = s_glob * sigma
    if mode == "global":
        return Rescaled(sigma=base, s_glob=s_glob, scale_ok=ok)
    if mode != "gcv":
        raise ValueError(f"unknown rescale mode {mode!r}; expected 'gcv' or 'global'")
    pos = positive_modes(e)
    out = base.clone()
    n_modes = int(pos.sum())
    if n_modes == 0:
        return Rescaled(sigma=out, s_glob=s_glob, scale_ok=ok)
    sp, rp, ep = sigma[pos], rho[pos], e[pos]
    lams = lambda_grid(ep, *grid)
    g = gcv_curve(lams, sp, rp, ep, s_glob)
    g = torch.where(torch.isfinite(g), g, torch.full_like(g, float("inf")))
    j = int(torch.argmin(g))
    lam = float(lams[j])
    vals = per_mode_scale(lam, sp, rp, ep, s_glob)
    vals, n_cl = kappa_clamp(vals, base[pos], kappa)
    out[pos] = vals
    med = float(ep.median())
    return Rescaled(
        sigma=out,
        s_glob=s_glob,
        scale_ok=ok,
        lam=lam,
        lam_rel=lam / med,
        grid_end="low" if j == 0 else ("high" if j == len(lams) - 1 else None),
        n_clamped=n_cl,
        n_modes=n_modes,
    )
