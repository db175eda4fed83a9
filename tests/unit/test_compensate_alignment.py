"""Anchored inter-layer alignment penalty (paper Sec. 4.5) and the profiled objective's gradient."""

from __future__ import annotations

import pytest
import torch

from coec.compensate import compensate
from coec.compensate.alignment import AlignmentSettings, alignment_grad, alignment_setup, alignment_value
from coec.compensate.gram import normalize_gram_
from coec.compensate.linalg import polar, svd
from coec.compensate.objective import AlignmentTerm, ProfiledObjective
from test_compensate_method_problems import make_oproj, make_problem

pytestmark = pytest.mark.usefixtures("one_thread")


def _fd(f, X, D, eps=1e-6):
    return (f(X + eps * D) - f(X - eps * D)) / (2 * eps)


@pytest.mark.parametrize("kind", ["projector", "angle"])
def test_alignment_gradient_matches_finite_differences(kind):
    W0, G, mean, keep, vp = make_oproj()
    al = alignment_setup(W0, keep, vp, AlignmentSettings(4, kind))
    g = torch.Generator().manual_seed(0)
    k = keep.numel()
    R = polar(torch.randn(k, k, generator=g, dtype=torch.float64))
    Rp = R[:4]
    grad = alignment_grad(Rp, al)
    for _ in range(5):
        D = torch.randn(Rp.shape, generator=g, dtype=torch.float64)
        fd = _fd(lambda X: alignment_value(X, al), Rp, D)
        assert float((grad * D).sum()) == pytest.approx(fd, rel=1e-6, abs=1e-12)


@pytest.mark.parametrize("kind", ["projector", "angle"])
def test_alignment_value_of_either_kind_and_gradient_shape(kind):
    """One set-up alignment measures either penalty (the reported align_projector_* and
    align_angle_*), each equal to the value of an alignment set up for that kind; the gradient
    has Rp's shape and dtype; an unknown kind is refused."""
    W0, G, mean, keep, vp = make_oproj()
    al = alignment_setup(W0, keep, vp, AlignmentSettings(4, kind))
    Rp = polar(
        torch.randn(keep.numel(), keep.numel(), generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    )[:4]
    for other in ("projector", "angle"):
        assert alignment_value(Rp, al, other) == alignment_value(
            Rp, alignment_setup(W0, keep, vp, AlignmentSettings(4, other))
        )
    assert alignment_value(Rp, al) == alignment_value(Rp, al, kind)
    grad = alignment_grad(Rp, al)
    assert grad.shape == Rp.shape and grad.dtype == Rp.dtype
    with pytest.raises(ValueError, match="align kind"):
        alignment_value(Rp, al, "cosine")


def test_alignment_penalty_definition():
    """A(R) = ||Uv^T (Rp^T Rp - Va Va^T) Uv||_F^2 / rp^2 with Va = orth(V_full[K, :rp])."""
    W0, G, mean, keep, vp = make_oproj()
    rp = 4
    al = alignment_setup(W0, keep, vp, AlignmentSettings(rp, "projector"))
    Vfull = torch.linalg.svd(W0)[2][:rp].mT
    Q, _ = torch.linalg.qr(Vfull[keep])
    assert torch.allclose(al.Va @ al.Va.mT, Q @ Q.mT, atol=1e-10)  # same anchor subspace
    Uv = torch.linalg.svd(vp, full_matrices=False)[0][:, :rp]
    R = svd(W0[:, keep])[2]
    Rp = R[:rp]
    ref = float(((Uv.mT @ (Rp.mT @ Rp - Q @ Q.mT) @ Uv) ** 2).sum()) / rp**2
    assert alignment_value(Rp, al) == pytest.approx(ref, rel=1e-10)
    # angle variant = mean sin^2 of the principal angles
    ang = alignment_setup(W0, keep, vp, AlignmentSettings(rp, "angle"))
    cos = torch.linalg.svdvals(Rp @ Q)
    assert alignment_value(Rp, ang) == pytest.approx(float((1 - cos**2).mean()), rel=1e-10)


@pytest.mark.parametrize("lam", [0.0, 50.0])
def test_profiled_objective_gradient_matches_finite_differences(lam):
    """Euclidean gradient of F(R) = min_s err(s U S R) + lam A(R) (envelope theorem at s*)."""
    W0, G, mean, keep, vp = make_oproj()
    G = normalize_gram_(G.clone())
    Gxx, WG = G[keep][:, keep], W0 @ G
    Gyx, c = WG[:, keep], float((WG * W0).sum())
    U, S, Vt = svd(W0[:, keep])
    al = alignment_setup(W0, keep, vp, AlignmentSettings(4, "projector"))
    obj = ProfiledObjective(U, S, Gxx, Gyx, c, AlignmentTerm(al, lam))
    g = torch.Generator().manual_seed(1)
    R = polar(Vt + 0.1 * torch.randn(Vt.shape, generator=g, dtype=Vt.dtype))
    grad = obj.grad(R, obj.evaluate(R))
    for _ in range(4):
        D = torch.randn(R.shape, generator=g, dtype=R.dtype)
        fd = _fd(lambda X: obj.evaluate(X).F, R, D)
        assert float((grad * D).sum()) == pytest.approx(fd, rel=1e-5)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_align_lambda_50_lowers_penalty_below_pruned_point(seed):
    W0, G, mean, keep, vp = make_oproj(seed=seed)
    out = compensate(W0, G, mean, keep, "coec", align_lambda=50.0, inputs={"value_proj": vp}, anchor_rank=4)
    i = out.info
    assert i["align_after"] < i["align_before"]
    assert i["align_after"] < 0.1 * i["align_before"]  # paper: median 7.2x at lambda_a = 50
    assert i["relerr_after"] < i["relerr_before"]
    h = i["objective_history"]
    assert all(b <= a for a, b in zip(h, h[1:]))
    free = compensate(W0, G, mean, keep, "coec", inputs={"value_proj": vp}, anchor_rank=4).info
    assert free["align_after"] > i["align_after"]  # lambda_a = 0 only reports the penalty


def test_angle_variant_lowers_principal_angles():
    W0, G, mean, keep, vp = make_oproj(seed=0)
    out = compensate(
        W0, G, mean, keep, "coec", align_lambda=50.0, align="angle", anchor_rank=4, compute_dtype="float64"
    )
    i = out.info
    assert i["align_angle_after"] < 0.1 * i["align_angle_before"]
    assert "align_projector_before" not in i  # no value_proj given: angle needs none
    h = i["objective_history"]
    assert all(b <= a for a, b in zip(h, h[1:]))


def test_alignment_needs_value_proj():
    W0, G, mean, keep, _ = make_problem()
    with pytest.raises(ValueError, match="value_proj"):
        compensate(W0, G, mean, keep, "coec", align_lambda=50.0)
