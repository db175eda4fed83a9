"""Library oracles: the project's linear algebra compared with independent implementations.

* Principal angles (coec.evaluate.geometry.principal_angles) against ``scipy.linalg.subspace_angles``:
  1e-9 degrees absolute on generic subspaces, widened to the oracle's own accuracy where it
  takes an arccos (``_scipy_angle_tol_deg``: near 0 degrees an arccos turns a cosine's round-off
  into ~sqrt(eps) radians, and whether that round-off is 0 or one ulp depends on the BLAS
  kernel); 1e-6 relative on angles down to 1e-7 rad (where scipy takes the arcsin). Our own
  angles are held to 1e-9 degrees against the exact values.
* Polar factor (coec.compensate.linalg: polar, polar_eigh and the Newton-Schulz
  retraction ns_polar) against ``scipy.linalg.polar``: 1e-10 max abs difference in float64,
  2e-5 in float32.
* Right solve on the Stiefel manifold (coec.compensate.stiefel.solve_reduced / solve_full)
  against pymanopt's Riemannian trust-region solver on the same profiled objective, written
  independently from its definition ``F(R) = min_s ||s U S R X^T - Y||^2 / ||Y||^2`` with the
  gradient and Hessian from PyTorch autograd (pymanopt's pytorch backend). The optimum
  objective values are compared (not the points: a rotation optimum need not be unique):
  1e-10 absolute for a solve run to convergence; with the default stopping rule (an inexact
  inner solve, 100 steps or a 7e-4 RMS step) at least 99.9% of the possible descent.

Oracle versions are pinned in envs/requirements.txt (scipy 1.17.1, pymanopt 2.2.1).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

scipy_linalg = pytest.importorskip("scipy.linalg")

from coec.compensate.descent import RightSolveSettings  # noqa: E402
from coec.compensate.linalg import polar, polar_eigh  # noqa: E402
from coec.compensate.newton_schulz import ns_polar  # noqa: E402
from coec.compensate.objective import ProfiledObjective  # noqa: E402
from coec.compensate.stiefel import RightProblem, solve_full, solve_reduced  # noqa: E402
from coec.evaluate.geometry import principal_angles  # noqa: E402

F64 = torch.float64


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _randn(*shape, g, dtype=F64):
    return torch.randn(*shape, generator=g, dtype=dtype)


def _scipy_angles_deg(A: torch.Tensor, B: torch.Tensor) -> np.ndarray:
    """scipy's angles (radians, descending) as degrees ascending, the project's convention."""
    return np.sort(np.rad2deg(scipy_linalg.subspace_angles(A.numpy(), B.numpy())))


def _scipy_angle_tol_deg(theta_deg: np.ndarray, n: int, floor: float = 1e-9) -> np.ndarray:
    """The accuracy of scipy's angles, per angle (degrees): ``floor``, or the error that either of
    scipy's two formulas makes of a round-off ``delta = 10 n eps`` (an n-row dot product and an
    SVD) in its argument, whichever is larger.

    scipy computes an angle as ``arccos(sigma)`` (cosines) or as ``arcsin(mu)`` (sines of the
    residual), choosing per index with a ``where`` whose two sides are sorted in opposite orders,
    so with both small and large angles present either formula can give any angle. Near 0 degrees
    the arccos, near 90 degrees the arcsin, turns ``delta`` into about ``sqrt(2 delta)`` radians;
    whether the round-off is 0 or one ulp depends on the BLAS kernel."""
    delta = 10 * n * np.finfo(np.float64).eps
    theta = np.deg2rad(np.asarray(theta_deg, dtype=np.float64))
    c, s = np.cos(theta), np.sin(theta)
    err = np.zeros_like(theta)
    for sign in (-1.0, 1.0):
        err = np.maximum(err, np.abs(np.arccos(np.clip(c + sign * delta, -1, 1)) - theta))
        err = np.maximum(err, np.abs(np.arcsin(np.clip(s + sign * delta, -1, 1)) - theta))
    return np.maximum(floor, np.rad2deg(err))


# ---------------------------------------------------------------------------- principal angles


@pytest.mark.parametrize("n,p,q", [(12, 3, 3), (12, 5, 2), (12, 2, 6), (40, 8, 8)])
def test_principal_angles_match_scipy(n, p, q):
    g = _gen(n * 100 + p * 10 + q)
    A, B = _randn(n, p, g=g), _randn(n, q, g=g)
    ours = principal_angles(A, B).numpy()
    assert ours.shape == (min(p, q),)
    ref = _scipy_angles_deg(A, B)
    assert np.all(np.abs(ours - ref) <= _scipy_angle_tol_deg(ref, n)), (ours, ref)


@pytest.mark.parametrize("eps", [1e-3, 1e-5, 1e-7])
def test_small_principal_angles_match_scipy(eps):
    """B = A tilted by ~eps rad into the complement: small angles kept to 1e-6 relative."""
    g = _gen(7)
    Q, _ = torch.linalg.qr(_randn(20, 8, g=g))
    A, C = Q[:, :4], Q[:, 4:]
    B = A + eps * C @ torch.diag(torch.tensor([1.0, 2.0, 3.0, 4.0], dtype=F64))
    ours, ref = principal_angles(A, B).numpy(), _scipy_angles_deg(A, B)
    np.testing.assert_allclose(ours, ref, rtol=1e-6, atol=0)
    np.testing.assert_allclose(np.deg2rad(ours), np.arctan(eps * np.arange(1, 5)), rtol=1e-6)


def test_orthogonal_and_shared_directions_match_scipy():
    Q, _ = torch.linalg.qr(_randn(10, 6, g=_gen(3)))
    A = Q[:, :3]
    B = torch.cat([Q[:, :1], Q[:, 3:5]], dim=1)  # one shared direction, two orthogonal
    ours = principal_angles(A, B).numpy()
    ref = _scipy_angles_deg(A, B)
    tol = _scipy_angle_tol_deg(ref, A.shape[0])
    assert tol.min() > 1e-6  # scipy's arccos of a cosine near 1, arcsin of a sine near 1
    assert np.all(np.abs(ours - ref) <= tol), (ours, ref, tol)
    # our own accuracy: the exact angles to 1e-9 degrees
    np.testing.assert_allclose(ours, [0.0, 90.0, 90.0], atol=1e-9, rtol=0)


# ---------------------------------------------------------------------------- polar factor


def _conditioned(m: int, n: int, cond: float, g, dtype=F64) -> torch.Tensor:
    """An m x n matrix with singular values log-spaced from 1 to 1/cond."""
    U, _ = torch.linalg.qr(_randn(m, min(m, n), g=g))
    V, _ = torch.linalg.qr(_randn(n, min(m, n), g=g))
    S = torch.logspace(0, -math.log10(cond), min(m, n), dtype=F64)
    return ((U * S) @ V.T).to(dtype)


def _scipy_polar(A: torch.Tensor) -> np.ndarray:
    return scipy_linalg.polar(A.double().numpy(), side="right")[0]


@pytest.mark.parametrize("fn", [polar, polar_eigh], ids=lambda f: f.__name__)
@pytest.mark.parametrize("shape,cond", [((9, 9), 10.0), ((20, 7), 1e3), ((7, 20), 50.0)])
def test_polar_matches_scipy(fn, shape, cond):
    A = _conditioned(*shape, cond, _gen(shape[0] * shape[1]))
    ours = fn(A).numpy()
    assert ours.shape == shape
    np.testing.assert_allclose(ours, _scipy_polar(A), rtol=0, atol=1e-10)


@pytest.mark.parametrize("dtype,atol", [(torch.float64, 1e-10), (torch.float32, 2e-5)])
@pytest.mark.parametrize("r,k,cond", [(4, 11, 5.0), (6, 6, 3.0), (16, 40, 20.0)])
def test_ns_polar_matches_scipy(dtype, atol, r, k, cond):
    """The retraction's (X X^T)^{-1/2} X of a wide frame is the polar factor of X."""
    X = _conditioned(r, k, cond, _gen(r * k), dtype)
    P, iters = ns_polar(X)
    assert P.dtype == dtype and iters >= 1
    np.testing.assert_allclose(P.double().numpy(), _scipy_polar(X), rtol=0, atol=atol)


# ---------------------------------------------------------------------------- right solve


def _toy_right_problem(d_out: int, k: int, n: int = 200, noise: float = 0.3, tilt: float = 0.4, seed: int = 1):
    """A calibration problem whose best rotation lies near (not at) the current frame Vt."""
    g = _gen(seed)
    X = _randn(n, k, g=g) @ (torch.eye(k, dtype=F64) + 0.3 * _randn(k, k, g=g))
    U, S, Vt = torch.linalg.svd(_randn(d_out, k, g=g), full_matrices=False)
    R_true = polar((Vt + tilt * _randn(*Vt.shape, g=g)).T).T
    Y = 1.3 * X @ (U * S @ R_true).T + noise * _randn(n, d_out, g=g)
    Gxx, Gyx, c = X.T @ X / n, Y.T @ X / n, float((Y * Y).sum() / n)
    return U, S, Vt, Gxx, Gyx, c


def _pymanopt_optimum(U, S, Vt, Gxx, Gyx, c) -> tuple[float, torch.Tensor]:
    """Minimise the profiled loss over St(r, k) with pymanopt's trust regions from R = Vt."""
    pymanopt = pytest.importorskip("pymanopt")
    from pymanopt.manifolds import Stiefel
    from pymanopt.optimizers import TrustRegions

    r, k = Vt.shape
    manifold = Stiefel(k, r)  # points are k x r with orthonormal columns: R^T
    W_of = U * S  # W = U diag(S) R

    @pymanopt.function.pytorch(manifold)
    def cost(Rt):
        W = W_of @ Rt.T
        quad = torch.sum((W @ Gxx) * W)  # tr(W Gxx W^T)
        lin = torch.sum(W * Gyx)  # tr(W Gyx^T)
        # min over s of (s^2 quad - 2 s lin + c) / c, at s = lin / quad
        return 1.0 - lin * lin / (quad * c)

    res = TrustRegions(verbosity=0).run(pymanopt.Problem(manifold, cost), initial_point=Vt.T.numpy().copy())
    return float(res.cost), torch.as_tensor(res.point).T


@pytest.mark.parametrize("d_out,k", [(4, 8), (8, 6)], ids=["polar r<k", "cayley r=k"])
def test_right_solve_matches_pymanopt(d_out, k):
    U, S, Vt, Gxx, Gyx, c = _toy_right_problem(d_out, k)
    lam = float(torch.linalg.eigvalsh(Gxx).max())
    F_ref, R_ref = _pymanopt_optimum(U, S, Vt, Gxx, Gyx, c)
    obj = ProfiledObjective(U, S, Gxx, Gyx, c)
    # the two objective formulas agree at pymanopt's optimum
    assert obj.evaluate(R_ref).F == pytest.approx(F_ref, abs=1e-12)
    start = obj.evaluate(Vt).F
    assert start > F_ref + 0.1  # a real descent is needed

    problem = RightProblem(Gxx, Gyx, c, lam)
    tight = solve_reduced(U, S, Vt, problem, RightSolveSettings(delta=1e-9, max_inner_steps=5000))
    assert abs(tight.F_end - F_ref) < 1e-10, (tight.F_end, F_ref, tight.stop)
    default = solve_reduced(U, S, Vt, problem)
    # the default stopping rule (an inexact inner solve) still takes >= 99.9% of the descent
    assert (start - default.F_end) / (start - F_ref) > 0.999, (default.F_end, F_ref, default.stop)
    full = solve_full(U, S, Vt, problem, RightSolveSettings(delta=1e-9, max_inner_steps=5000))
    assert abs(full.F_end - F_ref) < 1e-10, (full.F_end, F_ref, full.stop)
    # the reported scale is the profiled optimum at the final R
    q = float(torch.sum((U * S @ tight.R @ Gxx) * (U * S @ tight.R)))
    p = float(torch.sum((U * S @ tight.R) * Gyx))
    assert tight.s == pytest.approx(p / q, rel=1e-9)
