"""The compensation job's lean paths: in-place Gram symmetrisation, factorisation and shifts that
give the bits of the out-of-place formulas (so every result stays as it was), and the reported
errors from the residual (one ``W0 G`` product and the pruned block)."""

from __future__ import annotations

import pytest
import torch

from coec.compensate import compensate
from coec.compensate.errors import Moments, OutputError, output_energy, residual_errors
from coec.compensate.gram import gram_psd, normalize_gram_, symmetrize_, temper_gram
from coec.compensate.methods.bias import flap_bias
from coec.compensate.methods.lstsq import ridge_refit


def _problem(d_out=24, d_in=70, k=49, n=300, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    X = (torch.randn(n, d_in, generator=g, dtype=dtype) * torch.rand(d_in, generator=g, dtype=dtype)) + 0.2
    W0 = 0.1 * torch.randn(d_out, d_in, generator=g, dtype=dtype)
    keep = torch.sort(torch.randperm(d_in, generator=g)[:k]).values
    return W0, X.T @ X, X.mean(0), keep, float(n)


@pytest.mark.parametrize("d,block", [(1, 4), (7, 3), (64, 16), (70, 32), (70, 1024)])
def test_symmetrize_in_place_gives_the_bits_of_the_two_copy_formula(d, block):
    g = torch.Generator().manual_seed(d)
    for dtype in (torch.float32, torch.float64):
        G = torch.randn(d, d, generator=g, dtype=dtype)
        G[G.abs() < 0.1] = -0.0  # signed zeros: (-0) + (-0) stays -0 in both forms
        want = 0.5 * (G + G.mT)
        got = symmetrize_(G.clone(), block)
        assert torch.equal(got, want)
        assert torch.equal(torch.signbit(got), torch.signbit(want))
        assert torch.equal(got, got.mT)


def test_normalize_gram_in_place():
    _, G, _, _, _ = _problem()
    G = G + 1e-3 * torch.rand_like(G)  # not symmetric
    want = 0.5 * (G + G.mT)
    want = want / (float(torch.diagonal(want).sum()) / G.shape[0])
    inplace = G.clone()
    assert normalize_gram_(inplace) is inplace and torch.equal(inplace, want)


def test_tempered_gram_is_exactly_symmetric():
    _, G, _, _, _ = _problem(d_in=40, k=30)
    tg = temper_gram(normalize_gram_(G.clone()), 0.7)
    assert torch.equal(tg.G, tg.G.mT)


def test_psd_check_factorises_in_place_and_decides_as_before():
    _, G, _, _, _ = _problem(d_in=50, k=30)
    G = normalize_gram_(G.clone())
    same, info = gram_psd(G)
    assert same is G and info == {"indefinite": False}
    bad = G.clone()
    bad.diagonal()[:3] -= 5.0  # eigenvalues far below -tol * lambda_max
    proj, info = gram_psd(bad)
    assert info["indefinite"] and info["clipped"] >= 1
    assert float(torch.linalg.eigvalsh(proj).min()) > -1e-10


def test_ridge_refit_shift_in_place_equals_the_identity_formula_bit_for_bit():
    W0, G, _, keep, _ = _problem()
    G = normalize_gram_(G.clone())
    G[keep[3], keep[5]] = G[keep[5], keep[3]] = -0.0  # a signed zero off the diagonal of Gxx
    for ridge in (1e-2, 0.0):
        Gxx = G[keep][:, keep]
        lam = ridge * float(torch.diagonal(Gxx).mean())
        A = Gxx + lam * torch.eye(len(keep), dtype=G.dtype)
        L, info = torch.linalg.cholesky_ex(A)
        assert int(info) == 0
        want = torch.cholesky_solve((W0 @ G[:, keep]).mT, L).mT
        assert torch.equal(ridge_refit(W0, G, keep, ridge), want)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_output_energy_is_the_trace_over_column_blocks(dtype):
    W0, G, _, _, _ = _problem(dtype=dtype)
    W, G64 = W0.double(), G.double()
    want = float(torch.trace(W @ G64 @ W.mT))
    for block in (1, 7, 2048):
        assert output_energy(W0, G, block) == pytest.approx(want, rel=1e-12)


def test_residual_errors_equal_the_expanded_square_on_a_psd_gram():
    W0, G, mean, keep, n = _problem()
    Gn = normalize_gram_(G.clone())
    scale = float(torch.diagonal(G).sum()) / G.shape[0] / n  # E[x x^T] = scale * Gn
    err = OutputError(W0, Gn, keep, mean, scale)
    W, b = flap_bias(W0, mean, keep)
    got = residual_errors(W0, G, keep, W, b, Moments(mean, n))
    assert got["relerr_before"] == pytest.approx(err(W0[:, keep]), rel=1e-10)
    assert got["relerr_after_weight_only"] == pytest.approx(err(W), rel=1e-10)
    assert got["relerr_after"] == pytest.approx(err(W, b), rel=1e-10)
    assert got["relerr_after"] < got["relerr_before"]  # the bias removes the pruned columns' mean
    other = 1.3 * W0[:, keep]  # a weight that is not W0[:, K]: the full residual
    got = residual_errors(W0, G, keep, other)
    assert got["relerr_after"] == pytest.approx(err(other), rel=1e-10)
    assert set(got) == {"relerr_before", "relerr_after"}


def test_residual_errors_are_the_monte_carlo_errors_of_the_tokens():
    """The errors are E||W0 x - W x_K - b||^2 / E||W0 x||^2 over the calibration tokens."""
    g = torch.Generator().manual_seed(3)
    X = torch.randn(500, 30, generator=g, dtype=torch.float64) + 0.5
    W0 = torch.randn(8, 30, generator=g, dtype=torch.float64)
    keep = torch.arange(0, 30, 2)
    W, b = 0.9 * W0[:, keep], torch.randn(8, generator=g, dtype=torch.float64)
    got = residual_errors(W0, X.T @ X, keep, W, b, Moments(X.mean(0), 500))
    Y = X @ W0.mT
    want = float(((Y - X[:, keep] @ W.mT - b) ** 2).sum() / (Y**2).sum())
    assert got["relerr_after"] == pytest.approx(want, rel=1e-10)
    want_before = float(((Y - X[:, keep] @ W0[:, keep].mT) ** 2).sum() / (Y**2).sum())
    assert got["relerr_before"] == pytest.approx(want_before, rel=1e-10)


def test_residual_errors_need_the_means_for_a_bias():
    W0, G, _, keep, _ = _problem()
    with pytest.raises(ValueError, match="channel means"):
        residual_errors(W0, G, keep, W0[:, keep], torch.zeros(W0.shape[0]))


@pytest.mark.parametrize("method", ["none", "bias", "lstsq", "rcpu"])
def test_compensate_reports_the_residual_errors_on_the_metric(method):
    """Every method without errors of its own reports ``residual_errors`` on the PSD-checked,
    normalised metric; the prune-only error is the same number for every method."""
    W0, G, mean, keep, n = _problem(dtype=torch.float32)
    out = compensate(W0, G, mean, keep, method, n_tokens=n)
    assert out.info["gram_psd"] == {"indefinite": False}
    Gn = normalize_gram_(G.double().clone())
    scale = float(torch.diagonal(G.double()).sum()) / G.shape[0]
    want = residual_errors(W0, Gn, keep, out.weight, out.bias, Moments(mean, n / scale))
    assert set(want) <= set(out.info)
    for key, value in want.items():  # info is of the float64 solve, out.weight its float32 cast
        assert out.info[key] == pytest.approx(value, rel=1e-6), key
    none = compensate(W0, G, mean, keep, "none", n_tokens=n).info
    assert out.info["relerr_before"] == none["relerr_before"]
    if method == "bias":
        assert out.info["relerr_after"] < out.info["relerr_after_weight_only"] == out.info["relerr_before"]
    if method in ("lstsq", "rcpu"):
        assert out.info["relerr_after"] < out.info["relerr_before"]


@pytest.mark.parametrize("n", [1, 17, 64, 130])
def test_eigh_in_place_gives_the_bits_and_strides_of_a_copy(n):
    """COEC's tempering decomposes the Gram in its own storage on the CPU in float64; the
    eigenvectors, and the tempered Gram formed from them, are those of a decomposition of a copy."""
    from coec.compensate.linalg import eigh, eigh_overwrites

    g = torch.Generator().manual_seed(n)
    X = torch.randn(3 * n + 1, n, generator=g, dtype=torch.float64)
    G = normalize_gram_(X.T @ X)
    assert eigh_overwrites(G) and not eigh_overwrites(G.float())
    w0, E0 = eigh(G.clone())
    M = G.clone()
    w1, E1 = eigh(M, overwrite=True)
    assert E1.data_ptr() == M.data_ptr() and E1.stride() == E0.stride()
    assert torch.equal(w0, w1) and torch.equal(E0, E1)
    assert torch.equal(temper_gram(G.clone(), 0.9).G, temper_gram(G.clone(), 0.9, overwrite=True).G)
    F = G.float()
    w2, E2 = eigh(F, overwrite=True)  # not the last entry of the fallback chain: F is left as it was
    assert torch.equal(F, G.float())


def test_coec_setup_reforms_the_metric_after_an_in_place_decomposition():
    """The untempered errors come from the metric formed again after tempering: the same numbers
    as from the metric kept beside it."""
    W0, G, mean, keep, n = _problem(d_out=20, d_in=40, k=28)
    out = compensate(W0, G, mean, keep, "coec", align_lambda=0.0, max_rounds=2)
    Gn = normalize_gram_(G.clone())
    Gxx, Gyx = Gn[keep][:, keep], (W0 @ Gn)[:, keep]
    c = float(((W0 @ Gn) * W0).sum())
    from coec.compensate.errors import relerr

    # coec reports the errors of its float32 weights (the compute dtype)
    assert out.info["relerr_before"] == pytest.approx(relerr(W0[:, keep], Gxx, Gyx, c), rel=1e-6)
    assert out.info["relerr_after"] == pytest.approx(relerr(out.weight, Gxx, Gyx, c), rel=1e-6)
