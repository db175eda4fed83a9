"""GCV per-mode rescale (paper Sec. 4.3, App. B grid and kappa band)."""

from __future__ import annotations

import math

import pytest
import torch

from coec.compensate.gcv import gcv_curve, global_scale, kappa_clamp, lambda_grid, per_mode_scale, rescale


def _modes(r=12, seed=0):
    g = torch.Generator().manual_seed(seed)
    sigma = torch.sort(torch.rand(r, generator=g, dtype=torch.float64) + 0.1, descending=True).values
    e = torch.rand(r, generator=g, dtype=torch.float64) * 3 + 0.05
    rho = sigma * e * (1.0 + 0.3 * torch.randn(r, generator=g, dtype=torch.float64))
    return sigma, rho, e


def _err(s, rho, e):  # separable calibration error up to the constant c
    return float((e * s * s - 2 * rho * s).sum())


def test_limits_per_mode_and_global():
    sigma, rho, e = _modes()
    s_glob, ok = global_scale(sigma, rho, e)
    assert ok and s_glob == pytest.approx(float((sigma * rho).sum() / (sigma**2 * e).sum()))
    assert torch.allclose(per_mode_scale(1e-12, sigma, rho, e, s_glob), rho / e, rtol=1e-9)
    assert torch.allclose(per_mode_scale(1e12, sigma, rho, e, s_glob), s_glob * sigma, rtol=1e-9)
    lo = rescale(sigma, rho, e, "gcv", grid=(1e-14, 1e-13, 2), kappa=None).sigma
    hi = rescale(sigma, rho, e, "gcv", grid=(1e13, 1e14, 2), kappa=None).sigma
    assert torch.allclose(lo, rho / e, rtol=1e-9) and torch.allclose(hi, s_glob * sigma, rtol=1e-9)
    glob = rescale(sigma, rho, e, "global")
    assert torch.allclose(glob.sigma, s_glob * sigma) and glob.scale_ok and glob.lam is None


def test_gcv_curve_matches_paper_form_and_chosen_lambda_is_grid_argmin():
    sigma, rho, e = _modes(seed=1)
    s_glob, _ = global_scale(sigma, rho, e)
    lams = lambda_grid(e)
    assert lams.numel() == 120
    assert float(lams[0]) == pytest.approx(1e-4 * float(e.median())) and float(lams[-1]) == pytest.approx(
        1e5 * float(e.median())
    )
    M = sigma.numel()
    s_l = per_mode_scale(lams, sigma, rho, e, s_glob)
    df = (e / (e + lams[:, None])).sum(1)
    paper = (e * (s_l - rho / e) ** 2).sum(1) / (1 - df / M) ** 2
    ours = gcv_curve(lams, sigma, rho, e, s_glob)
    assert torch.allclose(ours[:100], paper[:100], rtol=1e-8)  # the paper form loses digits as lam grows
    res = rescale(sigma, rho, e, "gcv", kappa=None)
    new = res.sigma
    j = int(torch.argmin(ours))
    assert res.lam == pytest.approx(float(lams[j]))
    assert res.lam_rel == pytest.approx(float(lams[j]) / float(e.median()))
    assert float(ours[j]) <= float(ours.min())
    assert torch.allclose(new, per_mode_scale(float(lams[j]), sigma, rho, e, s_glob))
    # GCV(0+) is finite (0/0 of the paper form resolved) and GCV(inf) -> sum e (s* sigma - rho/e)^2
    g0 = gcv_curve(torch.tensor([0.0], dtype=torch.float64), sigma, rho, e, s_glob)
    assert math.isfinite(float(g0))
    ginf = gcv_curve(torch.tensor([1e14], dtype=torch.float64), sigma, rho, e, s_glob)
    assert float(ginf) == pytest.approx(float((e * (s_glob * sigma - rho / e) ** 2).sum()), rel=1e-6)


@pytest.mark.parametrize("seed", range(5))
def test_rescale_never_increases_error(seed):
    sigma, rho, e = _modes(seed=seed)
    base = _err(sigma, rho, e)
    for mode in ("gcv", "global"):
        new = rescale(sigma, rho, e, mode).sigma
        assert _err(new, rho, e) <= base + 1e-12
        glob = rescale(sigma, rho, e, "global").sigma
        assert _err(new, rho, e) <= _err(glob, rho, e) + 1e-12


def test_kappa_band_clamps():
    sigma, rho, e = _modes(seed=3)
    rho = rho.clone()
    rho[-1] = 1e4 * sigma[-1] * e[-1]  # per-mode optimum 1e4x the uniform value (App. B)
    rho[-2] = -50.0 * sigma[-2] * e[-2]  # wrong sign
    s_glob, _ = global_scale(sigma, rho, e)
    res = rescale(sigma, rho, e, "gcv", grid=(1e-12, 1e-11, 2), kappa=10.0)
    assert res.n_clamped >= 2
    ratio = res.sigma / (s_glob * sigma)
    assert float(ratio.min()) >= 0.1 - 1e-12 and float(ratio.max()) <= 10.0 + 1e-12
    unclamped = rescale(sigma, rho, e, "gcv", grid=(1e-12, 1e-11, 2), kappa=None)
    assert unclamped.n_clamped == 0 and float((unclamped.sigma / (s_glob * sigma)).max()) > 100
    vals, n = kappa_clamp(
        torch.tensor([5.0, -1.0, 0.5], dtype=torch.float64), torch.tensor([-1.0, -1.0, 0.0], dtype=torch.float64), 10.0
    )
    assert n == 2 and vals.tolist() == [-0.1, -1.0, 0.0]


def test_nonpositive_modes_keep_uniform_value_and_bad_scale_is_skipped():
    sigma, rho, e = _modes(seed=2)
    e = e.clone()
    e[3] = 0.0
    e[5] = -1.0
    s_glob, _ = global_scale(sigma, rho, e)
    res = rescale(sigma, rho, e, "gcv")
    new = res.sigma
    assert res.n_modes == sigma.numel() - 2
    assert float(new[3]) == pytest.approx(s_glob * float(sigma[3]))
    assert float(new[5]) == pytest.approx(s_glob * float(sigma[5]))
    s, ok = global_scale(sigma, rho, -e.abs())  # non-positive denominator
    assert (s, ok) == (1.0, False)
    res = rescale(sigma, rho, -e.abs(), "gcv")
    assert not res.scale_ok and torch.equal(res.sigma, sigma) and res.lam is None
