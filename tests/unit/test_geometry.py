"""Fast tests of the App. C measurements (src/coec/evaluate/geometry.py)."""

import math

import pytest
import torch

from coec.evaluate.geometry import (
    module_geometry,
    orth,
    principal_angles,
    projector_penalty,
    summarize_geometry,
    top_left_frame,
)
from coec.model.arch import expand_kv_rows


def _gen(seed=0):
    return torch.Generator().manual_seed(seed)


def top_right_frame(W, r):
    """Top-r right singular vectors of W (d_out x d_in) -> (d_in x r)."""
    return torch.linalg.svd(W, full_matrices=False)[2][:r].T


def frame_discrepancy(W_P, W_C, r):
    """module_geometry's App. C discrepancy of W_P -> W_C (every column kept)."""
    return module_geometry(W_P, torch.arange(W_P.shape[1]), W_C, r)["discrepancy"]


def spectral_gap(W, r):
    """module_geometry's spectral gap of W at rank r (every column kept)."""
    return module_geometry(W, torch.arange(W.shape[1]), W, r)["spectral_gap"]


def _rand_orth(n, seed=0):
    q, r = torch.linalg.qr(torch.randn(n, n, generator=_gen(seed), dtype=torch.float64))
    return q * torch.sign(torch.diagonal(r))


def _rotated_pair(thetas_deg, n=12, seed=0):
    """Frames A = [e_1..e_r] and B with B_i = cos t_i e_i + sin t_i e_{r+i}, in a random basis."""
    r = len(thetas_deg)
    t = torch.deg2rad(torch.tensor(thetas_deg, dtype=torch.float64))
    A = torch.zeros(n, r, dtype=torch.float64)
    B = torch.zeros(n, r, dtype=torch.float64)
    A[torch.arange(r), torch.arange(r)] = 1.0
    B[torch.arange(r), torch.arange(r)] = torch.cos(t)
    B[r + torch.arange(r), torch.arange(r)] = torch.sin(t)
    Q = _rand_orth(n, seed)
    return Q @ A, Q @ B


def test_orth_is_orthonormal_same_span_and_sign_fixed():
    A = torch.randn(10, 4, generator=_gen(1), dtype=torch.float64)
    Q = orth(A)
    assert Q.dtype == torch.float64
    torch.testing.assert_close(Q.T @ Q, torch.eye(4, dtype=torch.float64))
    torch.testing.assert_close(Q @ (Q.T @ A), A)  # A lies in span(Q)
    assert (torch.diagonal(Q.T @ A) > 0).all()  # diag(R) >= 0
    torch.testing.assert_close(orth(-A), -Q)


def test_principal_angles_match_constructed_rotations():
    thetas = [0.0, 1e-4, 3.0, 22.0, 45.0, 60.0, 89.0, 90.0]
    A, B = _rotated_pair(thetas, n=20)
    got = principal_angles(A, B)
    assert got.dtype == torch.float64
    torch.testing.assert_close(got, torch.tensor(sorted(thetas), dtype=torch.float64), atol=1e-9, rtol=0)
    # symmetric, and independent of a non-orthonormal parametrisation of the span
    torch.testing.assert_close(principal_angles(B, A), got, atol=1e-9, rtol=0)
    M = torch.randn(len(thetas), len(thetas), generator=_gen(3), dtype=torch.float64) + 3 * torch.eye(len(thetas))
    torch.testing.assert_close(principal_angles(A @ M, B), got, atol=1e-8, rtol=0)


def test_principal_angles_of_different_sizes_and_identical_spans():
    A, B = _rotated_pair([10.0, 30.0], n=8)
    extra = torch.randn(8, 1, generator=_gen(4), dtype=torch.float64)
    got = principal_angles(torch.cat([A, extra], 1), B)
    assert got.shape == (2,)
    assert got.max() <= 30.0 + 1e-9
    assert principal_angles(A, A).abs().max() < 1e-6


def test_principal_angles_invariant_to_in_subspace_rotation_while_frames_differ():
    A, B = _rotated_pair([5.0, 20.0, 40.0], n=10)
    Q = _rand_orth(3, seed=7)
    torch.testing.assert_close(principal_angles(A, B @ Q), principal_angles(A, B), atol=1e-9, rtol=0)
    assert principal_angles(B, B @ Q).max() < 1e-6
    assert torch.linalg.matrix_norm(B @ Q - B) > 0.5  # the frames themselves differ


def test_top_frames_are_singular_vectors():
    U = _rand_orth(6, 1)[:, :4]
    V = _rand_orth(9, 2)[:, :4]
    S = torch.tensor([5.0, 3.0, 2.0, 1.0], dtype=torch.float64)
    W = U @ torch.diag(S) @ V.T
    assert top_right_frame(W, 2).shape == (9, 2)
    assert top_left_frame(W, 3).shape == (6, 3)
    assert principal_angles(top_right_frame(W, 2), V[:, :2]).max() < 1e-6
    assert principal_angles(top_left_frame(W, 3), U[:, :3]).max() < 1e-6
    with pytest.raises(ValueError):
        top_left_frame(W, 7)


def test_projector_penalty_matches_explicit_projectors():
    k, r = 12, 3
    R, A, Uv = (orth(torch.randn(k, r, generator=_gen(s), dtype=torch.float64)) for s in (1, 2, 3))
    D = Uv.T @ (R @ R.T - A @ A.T) @ Uv
    assert projector_penalty(R, A, Uv) == pytest.approx(float((D**2).sum()) / r**2, rel=1e-12)
    assert projector_penalty(A, A, Uv) == 0.0
    assert projector_penalty(R, A, Uv) > 1e-4


def test_projector_penalty_blind_to_in_subspace_rotation():
    """App. C 'Choice of metric': Pi(V O) = Pi(V) for O in O(r_p); principal angles are not blind."""
    k, r = 16, 4
    anchor = orth(torch.randn(k, r, generator=_gen(5), dtype=torch.float64))
    Uv = orth(torch.randn(k, r, generator=_gen(6), dtype=torch.float64))
    Q = _rand_orth(r, seed=8)
    assert projector_penalty(anchor @ Q, anchor, Uv) < 1e-28
    assert torch.linalg.matrix_norm(anchor @ Q - anchor) > 0.5
    # a rotation out of the subspace is seen by the penalty and by the angles
    _, B = _rotated_pair([10.0, 20.0, 30.0, 40.0], n=k, seed=0)
    A0, _ = _rotated_pair([10.0, 20.0, 30.0, 40.0], n=k, seed=0)
    assert projector_penalty(B, A0, Uv) > 1e-4
    assert projector_penalty(B @ Q, A0, Uv) == pytest.approx(projector_penalty(B, A0, Uv), rel=1e-10)


@pytest.mark.parametrize("d_out,k", [(10, 7), (6, 11)])
def test_frame_discrepancy_zero_for_joint_orthogonal_equivalence(d_out, k):
    """W_C = Q_l W_P Q_r with Q_l U_P = U_P A and Q_r^T V_P = V_P A: both frames move by A."""
    q = min(d_out, k)
    S = torch.linspace(4.0, 0.5, q, dtype=torch.float64)  # distinct singular values
    U = _rand_orth(d_out, 1)[:, :q]
    V = _rand_orth(k, 2)[:, :q]
    W_P = U @ torch.diag(S) @ V.T
    A = _rand_orth(q, 3)
    Q_l = U @ A @ U.T + torch.eye(d_out, dtype=torch.float64) - U @ U.T
    Q_r = (V @ A @ V.T + torch.eye(k, dtype=torch.float64) - V @ V.T).T
    torch.testing.assert_close(Q_l @ Q_l.T, torch.eye(d_out, dtype=torch.float64))
    torch.testing.assert_close(Q_r @ Q_r.T, torch.eye(k, dtype=torch.float64))
    W_C = Q_l @ W_P @ Q_r
    assert torch.linalg.matrix_norm(W_C - W_P) > 0.5
    for r in (2, q - 1):
        assert frame_discrepancy(W_P, W_C, r) < 1e-8
    # an order-preserving per-mode rescale keeps the pairing too
    W_S = U @ torch.diag(S * torch.linspace(1.1, 0.9, q, dtype=torch.float64)) @ V.T
    assert frame_discrepancy(W_P, W_S, 2) < 1e-8
    # a one-sided rotation breaks it
    assert frame_discrepancy(W_P, _rand_orth(d_out, 9) @ W_P, 2) > 0.1


def test_spectral_gap():
    W = torch.diag(torch.tensor([8.0, 4.0, 2.0, 2.0], dtype=torch.float64))
    assert spectral_gap(W, 1) == pytest.approx(2.0)
    assert spectral_gap(W, 3) == pytest.approx(1.0)
    assert spectral_gap(W, 4) == math.inf


def test_expand_kv_rows_follows_query_head_layout():
    n_kv, n_rep, hd, d = 2, 3, 4, 5
    v = torch.arange(n_kv * hd * d, dtype=torch.float64).reshape(n_kv * hd, d)
    e = expand_kv_rows(v, n_rep, hd)
    assert e.shape == (n_kv * n_rep * hd, d)
    for h in range(n_kv * n_rep):
        torch.testing.assert_close(e[h * hd : (h + 1) * hd], v[(h // n_rep) * hd : (h // n_rep + 1) * hd])


def _layer(d_out=12, d_in=20, seed=0):
    g = _gen(seed)
    W0 = torch.randn(d_out, d_in, generator=g, dtype=torch.float64)
    keep = torch.sort(torch.randperm(d_in, generator=g)[:14]).values
    value = torch.randn(14, 9, generator=g, dtype=torch.float64)
    return W0, keep, value


def test_module_geometry_prune_only_and_in_subspace_rotation():
    W0, keep, value = _layer()
    W_K = W0[:, keep]
    r = 3
    g = module_geometry(W0, keep, W_K, r, value_proj=value)
    assert g["angle_PC_max"] < 1e-6 and g["discrepancy"] < 1e-10
    assert g["penalty_C"] == pytest.approx(g["penalty_P"], rel=1e-9)
    assert g["angle_OP_mean"] > 1.0 and g["penalty_P"] > 0
    assert g["angle_OP_max"] >= g["angle_OP_mean"]
    assert g["k"] == 14 and g["r"] == 3 and g["spectral_gap"] >= 1.0
    # right rotation inside the top-r right subspace: same subspace, same penalty
    P = top_right_frame(W_K, r)
    Q_r = torch.eye(14, dtype=torch.float64) + P @ (_rand_orth(r, 4) - torch.eye(r, dtype=torch.float64)) @ P.T
    g2 = module_geometry(W0, keep, W_K @ Q_r, r, value_proj=value)
    assert g2["angle_PC_max"] < 1e-5
    assert g2["penalty_C"] == pytest.approx(g["penalty_P"], rel=1e-7)
    # keeping every column: O and P coincide
    g3 = module_geometry(W0, torch.arange(20), W0, r)
    assert g3["angle_OP_max"] < 1e-5 and math.isnan(g3["penalty_P"])


def test_module_geometry_rejects_bad_shapes():
    W0, keep, value = _layer()
    with pytest.raises(ValueError):
        module_geometry(W0, keep, W0, 3)
    with pytest.raises(ValueError):
        module_geometry(W0, keep, W0[:, keep], 3, value_proj=value[:5])


def test_summarize_geometry_counts_and_factors():
    rows = [
        {
            "module": "o_proj",
            "layer": 0,
            "angle_OP_mean": 20.0,
            "angle_OC_mean": 22.0,
            "discrepancy": 0.01,
            "penalty_P": 1e-4,
            "penalty_C": 1e-5,
        },
        {
            "module": "o_proj",
            "layer": 1,
            "angle_OP_mean": 30.0,
            "angle_OC_mean": 25.0,
            "discrepancy": 0.03,
            "penalty_P": 2e-6,
            "penalty_C": 1e-6,
        },
        {
            "module": "o_proj",
            "layer": 2,
            "angle_OP_mean": 10.0,
            "angle_OC_mean": 11.0,
            "discrepancy": 0.02,
            "penalty_P": 1e-6,
            "penalty_C": 0.0,
        },
        {
            "module": "down_proj",
            "layer": 0,
            "angle_OP_mean": 8.0,
            "angle_OC_mean": 9.0,
            "discrepancy": 0.02,
            "penalty_P": math.nan,
            "penalty_C": math.nan,
        },
    ]
    s = summarize_geometry(rows)
    assert s["n_module_layers"] == 4
    assert s["n_OC_gt_OP"] == 3 and s["o_proj.n_OC_gt_OP"] == 2
    assert s["o_proj.angle_OP_mean"] == pytest.approx(20.0)
    assert (s["o_proj.angle_OP_min"], s["o_proj.angle_OP_max"]) == (10.0, 30.0)
    assert s["o_proj.angle_OC_mean"] == pytest.approx(58.0 / 3)
    assert s["down_proj.angle_OP_mean"] == 8.0 and s["down_proj.n"] == 1
    assert s["n_penalty"] == 3
    assert s["penalty_reduction_median"] == pytest.approx(10.0)
    assert s["penalty_reduction_max"] == math.inf
    assert s["penalty_P_median"] == pytest.approx(2e-6)
    assert s["discrepancy_mean"] == pytest.approx(0.02) and s["discrepancy_max"] == 0.03
    assert s["o_proj.discrepancy_max"] == 0.03
