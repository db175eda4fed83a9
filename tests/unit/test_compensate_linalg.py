"""Kernels: polar factor, Newton–Schulz iterations, retractions, tempering, relative error."""

from __future__ import annotations

import math

import pytest
import torch

from coec.compensate import linalg
from coec.compensate.errors import relerr
from coec.compensate.gram import normalize_gram_, power_max_eig, temper_gram
from coec.compensate.linalg import polar, polar_eigh, svd_eigh, top_singular_vectors
from coec.compensate.newton_schulz import ns_inv_sqrt, ns_inverse, ns_polar, ns_polar_with
from coec.compensate.retraction import retract_cayley, retract_polar, retract_polar_with, riemannian_grad
from test_compensate_method_problems import make_problem

F64 = torch.float64


def _eye(n):
    return torch.eye(n, dtype=F64)


def test_polar_is_procrustes_optimum():
    g = torch.Generator().manual_seed(0)
    A = torch.randn(7, 7, generator=g, dtype=F64)
    Q = polar(A)
    assert torch.allclose(Q @ Q.mT, _eye(7), atol=1e-12)
    best = float((Q * A).sum())
    for _ in range(50):
        Z, _ = torch.linalg.qr(torch.randn(7, 7, generator=g, dtype=F64))
        assert float((Z * A).sum()) <= best + 1e-12
    T = polar(torch.randn(9, 4, generator=g, dtype=F64))  # thin: orthonormal columns
    assert torch.allclose(T.mT @ T, _eye(4), atol=1e-12)


def test_newton_schulz_kernels():
    g = torch.Generator().manual_seed(1)
    X = torch.randn(6, 15, generator=g, dtype=F64)
    P, _ = ns_polar(X)
    assert torch.allclose(P @ P.mT, _eye(6), atol=1e-12)
    assert torch.allclose(P, polar(X.mT).mT, atol=1e-10)
    M = X @ X.mT
    inv = ns_inv_sqrt(M)
    Z = inv.Z / inv.scale**0.5
    assert torch.allclose(Z @ M @ Z, _eye(6), atol=1e-10)
    A = torch.randn(8, 8, generator=g, dtype=F64)
    Minv, _ = ns_inverse(_eye(8) + 0.3 * (A - A.mT))
    assert torch.allclose(Minv @ (_eye(8) + 0.3 * (A - A.mT)), _eye(8), atol=1e-12)
    B = torch.randn(5, 5, generator=g, dtype=F64) + 5 * _eye(5)  # default start also converges
    assert torch.allclose(ns_inverse(B)[0] @ B, _eye(5), atol=1e-10)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("scale", [1.0, 1.37])
def test_ns_polar_skips_the_identity_product_exactly(dtype, scale):
    """When X X^T already passes the check (a tiny step), ``ns_polar`` scales X instead of
    multiplying it by I / sqrt(scale): the same numbers and layout as the product it replaces."""
    g = torch.Generator().manual_seed(3)
    Rt = torch.cat([polar(torch.randn(28, 12, generator=g, dtype=F64)), torch.zeros(12, 12, dtype=F64)])
    R = Rt.mT.to(dtype)  # (12, 40) row-orthonormal, its last 12 columns zero
    X = R * math.sqrt(scale)  # X X^T = scale I to round-off
    X[:3, 30:] = -0.0  # negative zeros come out of the product as +0
    P, it = ns_polar(X, scale=scale)
    assert it == 1  # converged at the first check: no update
    reference = (torch.eye(12, dtype=dtype) / math.sqrt(scale)) @ X
    assert not X.is_contiguous()  # a transposed layout, as a frame from an SVD has
    bits = torch.int32 if dtype == torch.float32 else torch.int64
    assert torch.equal(P.view(bits), reference.view(bits))  # the same bits (signed zeros too)
    assert P.stride() == reference.stride()  # and the product's row-major layout: later GEMMs round alike
    P2, it2 = ns_polar(X + 0.3 * torch.randn(12, 40, generator=g, dtype=F64).to(dtype), scale=3.0)
    assert it2 > 1 and torch.allclose(P2 @ P2.mT, torch.eye(12, dtype=dtype), atol=1e-5)  # the iterating path


@pytest.mark.parametrize("step", [1e-8, 0.3])  # no Newton-Schulz update / updates
def test_polar_retraction_carries_the_metric_product(step):
    """``retract_polar_with`` returns ``retract_polar``'s frame bit for bit, and with it
    ``R_new Gxx`` formed from ``R Gxx`` and ``D Gxx`` alone, equal to the direct product."""
    g = torch.Generator().manual_seed(4)
    R = polar(torch.randn(30, 8, generator=g, dtype=F64)).mT  # (8, 30) row-orthonormal
    A = torch.randn(30, 30, generator=g, dtype=F64)
    Gxx = A @ A.mT / 30
    rg = riemannian_grad(R, torch.randn(8, 30, generator=g, dtype=F64))
    D = step * rg / float(rg.norm())
    P, PG = retract_polar_with(R, D, R @ Gxx, D @ Gxx)
    _, _, its = ns_polar_with(R - D, None, scale=1.0)
    assert (its == 1) == (step < 1e-3)  # both branches of the factor are exercised
    assert torch.equal(P, retract_polar(R, D))
    assert torch.allclose(PG, P @ Gxx, rtol=0, atol=1e-12 * float(Gxx.abs().max()))
    assert retract_polar_with(R, D)[1] is None
    X32, Y32 = (R - D).float(), ((R - D) @ Gxx).float()
    P32, PG32, _ = ns_polar_with(X32, Y32, scale=1.0)
    assert torch.equal(P32, ns_polar(X32, scale=1.0)[0])
    assert torch.allclose(PG32.double(), P32.double() @ Gxx, atol=1e-5 * float(Gxx.abs().max()))


def test_retractions_stay_on_the_manifold_and_follow_the_gradient():
    g = torch.Generator().manual_seed(2)
    R = polar(torch.randn(15, 6, generator=g, dtype=F64)).mT  # (6, 15) row-orthonormal
    Xi = torch.randn(6, 15, generator=g, dtype=F64)
    rg = riemannian_grad(R, Xi)
    assert torch.allclose(R @ rg.mT + rg @ R.mT, torch.zeros(6, 6, dtype=F64), atol=1e-12)  # tangent
    for t in (1e-3, 0.1):
        Rn = retract_polar(R, t * rg / float(rg.norm()))
        assert torch.allclose(Rn @ Rn.mT, _eye(6), atol=1e-12)
    t = 1e-6
    Rn = retract_polar(R, t * rg)
    assert torch.allclose((Rn - R) / t, -rg, atol=1e-5)  # first-order: R - t grad
    Rs = polar(torch.randn(6, 6, generator=g, dtype=F64))
    Xs = torch.randn(6, 6, generator=g, dtype=F64)
    B = Xs @ Rs.mT
    A = 0.5 * (B - B.mT)
    Rc = retract_cayley(Rs, A, 0.7)
    assert torch.allclose(Rc @ Rc.mT, _eye(6), atol=1e-12)
    assert torch.allclose((retract_cayley(Rs, A, t) - Rs) / t, -A @ Rs, atol=1e-5)
    # the LU-solve inverse gives the same retraction as Newton-Schulz, and rejects unknown names
    for step in (0.05, 0.7, 3.0):
        assert torch.allclose(retract_cayley(Rs, A, step, "solve"), retract_cayley(Rs, A, step), atol=1e-12)
    with pytest.raises(ValueError, match="cayley inverse"):
        retract_cayley(Rs, A, 0.1, "qr")


def test_tempering_and_normalisation():
    W0, G, mean, keep, X = make_problem(8, 20, 12, 100)
    Gn = normalize_gram_(G.clone())
    assert float(Gn.diagonal().mean()) == pytest.approx(1.0)
    assert torch.allclose(normalize_gram_(G / 100.0), Gn, rtol=1e-12)
    t1 = temper_gram(Gn, 1.0)
    assert torch.allclose(t1.G, Gn, atol=1e-10) and t1.n_negative >= 0
    Gh = temper_gram(Gn, 0.5).G
    assert torch.allclose(Gh @ Gh, Gn, atol=1e-8)  # G^(1/2) squared
    ev, E = torch.linalg.eigh(Gn)
    ev[:2] = -0.5
    Gi = (E * ev) @ E.mT
    tc = temper_gram(Gi, 0.9)
    assert tc.n_negative == 2 and float(torch.linalg.eigvalsh(tc.G).min()) > -1e-10
    assert power_max_eig(Gn) == pytest.approx(float(ev.max()), rel=1e-3)


def test_relerr_matches_token_level_definition():
    W0, G, mean, keep, X = make_problem(8, 20, 12, 100)
    g = torch.Generator().manual_seed(3)
    W = torch.randn(8, 12, generator=g, dtype=F64)
    Y = W0 @ X
    emp = float(((Y - W @ X[keep]) ** 2).sum() / (Y**2).sum())
    WG = W0 @ G
    assert relerr(W, G[keep][:, keep], WG[:, keep], float((WG * W0).sum())) == pytest.approx(emp, rel=1e-10)


def test_polar_eigh_matches_svd_polar_and_falls_back():
    g = torch.Generator().manual_seed(4)
    A = torch.randn(12, 8, generator=g, dtype=F64) * torch.logspace(0, -2, 8, dtype=F64)
    assert torch.allclose(polar_eigh(A), polar(A), atol=1e-10)
    assert torch.allclose(polar_eigh(A.float()), polar(A).float(), atol=1e-5)
    D = A.clone()
    D[:, 3] = 0.0  # rank-deficient: eigh path refuses, the SVD polar is used
    rec = []
    P = polar_eigh(D, rec)
    assert rec == ["polar_eigh->svd"]
    assert torch.allclose(P.mT @ P, _eye(8), atol=1e-12)
    assert torch.allclose(P, polar(D), atol=1e-12)


@pytest.mark.parametrize("log_cond", [3.0, 6.0, 7.0])
def test_polar_eigh_keeps_the_eigh_path_on_ill_conditioned_left_rotations(log_cond, monkeypatch):
    """Left-rotation matrices of pruned layers reach cond ~1e6 (A^T A ~1e12): the eigh path must
    still be taken (no SVD fallback) and maximise <P, A> as the SVD polar does, to ~1e-10."""
    g = torch.Generator().manual_seed(5)
    m, n = 96, 64
    U = torch.linalg.qr(torch.randn(m, n, generator=g, dtype=F64))[0]
    V = torch.linalg.qr(torch.randn(n, n, generator=g, dtype=F64))[0]
    s = torch.logspace(0, -log_cond, n, dtype=F64)
    A = (U * s) @ V.mT

    def no_svd(*a, **k):
        raise AssertionError("fell back to the SVD polar")

    monkeypatch.setattr(linalg, "polar", no_svd)
    for dt, tol in ((F64, 1e-10), (torch.float32, 1e-5)):
        rec = []
        P = polar_eigh(A.to(dt), rec)
        assert rec == []
        P = P.to(F64)
        assert float((P.mT @ P - _eye(n)).abs().max()) < tol
        best = float(s.sum())  # max <Z, A> over orthonormal Z = nuclear norm
        assert (best - float((P * A).sum())) / best < (1e-10 if dt == F64 else 1e-6)


@pytest.mark.parametrize("shape", [(96, 64), (64, 96)])
@pytest.mark.parametrize("log_cond", [2.0, 6.0])
def test_svd_eigh_is_a_thin_svd(shape, log_cond, monkeypatch):
    """The GPU setup factorisation: orthonormal factors that reproduce A, S descending and equal to
    the singular values, without touching the SVD chain; a rank-deficient A falls back (recorded)."""
    g = torch.Generator().manual_seed(6)
    m, n = shape
    p = min(m, n)
    U0 = torch.linalg.qr(torch.randn(m, p, generator=g, dtype=F64))[0]
    V0 = torch.linalg.qr(torch.randn(n, p, generator=g, dtype=F64))[0]
    s = torch.logspace(0, -log_cond, p, dtype=F64)
    A = (U0 * s) @ V0.mT
    real_svd = linalg.svd

    def no_svd(*a, **k):
        raise AssertionError("fell back to the SVD")

    monkeypatch.setattr(linalg, "svd", no_svd)
    for dt, tol in ((F64, 1e-10), (torch.float32, 1e-5)):
        U, S, Vh = svd_eigh(A.to(dt))
        U, S, Vh = U.double(), S.double(), Vh.double()
        assert U.shape == (m, p) and S.shape == (p,) and Vh.shape == (p, n)
        assert float((U.mT @ U - _eye(p)).abs().max()) < tol
        assert float((Vh @ Vh.mT - _eye(p)).abs().max()) < tol
        assert bool((S[1:] <= S[:-1]).all())
        assert float(((U * S) @ Vh - A).norm() / A.norm()) < tol
        assert float((S - s).abs().max()) < (1e-8 if dt == F64 else 1e-5)
    monkeypatch.setattr(linalg, "svd", real_svd)
    D = A.clone()
    D[:, 0] = 0.0
    D[0, :] = 0.0
    rec = []
    U, S, Vh = svd_eigh(D, rec)
    assert rec == ["svd_eigh->svd"]
    assert float(((U * S) @ Vh - D).norm()) < 1e-10


def test_top_singular_vectors_eigh_spans_the_svd_subspace():
    g = torch.Generator().manual_seed(8)
    A = torch.randn(40, 30, generator=g, dtype=F64) * torch.logspace(0, -2, 30, dtype=F64)
    U, _, Vh = torch.linalg.svd(A, full_matrices=False)
    for side, ref in (("left", U[:, :5]), ("right", Vh[:5].mT)):
        E = top_singular_vectors(A, 5, side, "eigh")
        assert torch.allclose(E.mT @ E, _eye(5), atol=1e-12)
        assert torch.allclose(E @ E.mT, ref @ ref.mT, atol=1e-10)  # same subspace (projectors)
        S = top_singular_vectors(A, 5, side, "svd")
        assert torch.allclose(S @ S.mT, ref @ ref.mT, atol=1e-12)
    with pytest.raises(ValueError, match="side"):
        top_singular_vectors(A, 5, "both")
