"""Geometric measurements of pruning and compensation (paper Sec. 4.5, Sec. 5.6, App. C).

Pure functions: tensors in, tensors / floats / dicts out, no I/O. Every measurement is done
in float64 (inputs of any dtype/device are moved to CPU float64 first).

Conventions (App. C): for a module with original weight ``W0`` (d_out x d_in) and kept input
columns ``K`` (|K| = k),

* ``O`` -- the original read frame restricted to the kept coordinates,
  ``orth(V_full,r[K, :])`` (k x r), also the anchor of the Sec. 4.5 penalty;
* ``P`` -- the top-r right singular frame of the pruned weight ``W_K = W0[:, K]`` (k x r);
* ``C`` -- the top-r right singular frame of the compensated weight (k x r).

Frames are column-orthonormal matrices; subspaces are compared by principal angles
(rotation-aware only up to the subspace) and by the projector penalty of Sec. 4.5 (blind to
any rotation inside the subspace, App. C "Choice of metric").
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping, Sequence

import torch
from torch import Tensor


def _f64(x: Tensor) -> Tensor:
    return torch.as_tensor(x).detach().to(device="cpu", dtype=torch.float64)


def _svd(W: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Thin SVD in float64 with a deterministic sign convention.

    Returns ``U`` (m x q), ``S`` (q,), ``V`` (n x q), q = min(m, n), with ``W = U diag(S) V^T``.
    Each pair (u_i, v_i) is flipped together so that the largest-magnitude entry of v_i is
    positive; the pairing of left and right vectors is never broken.
    """
    W = _f64(W)
    if W.ndim != 2:
        raise ValueError(f"expected a 2-D weight, got shape {tuple(W.shape)}")
    U, S, Vh = torch.linalg.svd(W, full_matrices=False)
    V = Vh.T
    idx = V.abs().argmax(dim=0)
    sign = torch.sign(V[idx, torch.arange(V.shape[1])])
    sign[sign == 0] = 1.0
    return U * sign, S, V * sign


def _check_rank(W: Tensor, r: int) -> None:
    q = min(W.shape)
    if not 1 <= r <= q:
        raise ValueError(f"rank r={r} must be in [1, min(shape)={q}] for weight {tuple(W.shape)}")


def orth(A: Tensor) -> Tensor:
    """Orthonormal basis of the column space of ``A`` (n x r, r <= n) -> (n x r), float64.

    Thin QR with the sign fixed so that diag(R) >= 0, which makes the basis unique for a
    full-column-rank ``A`` (the first j basis vectors span the first j columns of ``A``).
    Used for the anchor ``V_anchor = orth(V_full,r[K, :])`` of Sec. 4.5.
    """
    A = _f64(A)
    if A.ndim != 2 or A.shape[1] > A.shape[0]:
        raise ValueError(f"orth expects a tall n x r matrix, got shape {tuple(A.shape)}")
    Q, R = torch.linalg.qr(A, mode="reduced")
    d: torch.Tensor = torch.sign(torch.diagonal(R))
    d[d == 0] = 1.0
    out: torch.Tensor = Q * d
    return out


def principal_angles(A: Tensor, B: Tensor) -> Tensor:
    """Principal angles in degrees between span(A) and span(B), ascending, float64.

    ``A`` (n x p), ``B`` (n x q); both are orthonormalised first; min(p, q) angles are returned.
    Cosines are the singular values of ``Qa^T Qb`` clamped to [0, 1]; for angles below 45 deg
    the sines (singular values of ``(I - Qa Qa^T) Qb``) are used instead, which keeps small
    angles accurate where arccos loses half the digits. (App. C: "principal angles between
    top-r_p frames".)
    """
    Qa, Qb = orth(A), orth(B)
    if Qa.shape[0] != Qb.shape[0]:
        raise ValueError(f"frames live in different spaces: {tuple(Qa.shape)} vs {tuple(Qb.shape)}")
    if Qb.shape[1] > Qa.shape[1]:
        Qa, Qb = Qb, Qa
    M = Qa.T @ Qb
    cos = torch.linalg.svdvals(M).clamp(0.0, 1.0)  # descending -> angles ascending
    sin = torch.linalg.svdvals(Qb - Qa @ M).clamp(0.0, 1.0).flip(0)  # ascending
    theta = torch.where(cos * cos < 0.5, torch.arccos(cos), torch.arcsin(sin))
    return torch.rad2deg(theta)


def top_left_frame(W: Tensor, r: int) -> Tensor:
    """Top-r left singular vectors of ``W`` (d_out x d_in) -> (d_out x r), float64."""
    _check_rank(W, r)
    return _svd(W)[0][:, :r]


def projector_penalty(R_frame: Tensor, anchor_frame: Tensor, U_v: Tensor) -> float:
    """Anchored alignment penalty of Sec. 4.5, written with frames.

    ``A = ||U_v^T (P_R - P_anchor) U_v||_F^2 / r_p^2`` with ``P_X = X X^T``.

    ``R_frame`` (k x r_p): orthonormal top-r_p right frame of the (compensated) o_proj, i.e.
    ``R[:r_p]^T`` in the paper's notation; ``anchor_frame`` (k x r_p): orthonormal anchor
    ``orth(V_full,r_p[K, :])``; ``U_v`` (k x r_p): leading left singular vectors of the pruned
    value projection in the query-head layout. r_p is taken as ``U_v.shape[1]`` (the size of
    the compared block). The k x k projectors are never formed.
    """
    R, A, U = _f64(R_frame), _f64(anchor_frame), _f64(U_v)
    if not (R.shape[0] == A.shape[0] == U.shape[0]):
        raise ValueError(f"frames must share the row dimension k: {tuple(R.shape)}, {tuple(A.shape)}, {tuple(U.shape)}")
    UR, UA = U.T @ R, U.T @ A
    D = UR @ UR.T - UA @ UA.T
    r_p = U.shape[1]
    return float((D * D).sum() / (r_p * r_p))


def _discrepancy(svd_P: tuple[Tensor, Tensor, Tensor], svd_C: tuple[Tensor, Tensor, Tensor], r: int) -> float:
    """Intra-layer frame-change discrepancy of App. C: ``||Q_u - Q_v||_F / ||Q_u||_F``.

    ``Q_u = U_P^T U_C`` and ``Q_v = V_P^T V_C`` (r x r) from the top-r singular frames (``_svd``)
    of the pruned weight ``W_P`` and the compensated weight ``W_C`` (both d_out x k). Zero when the
    left and right frames move by the same rotation, e.g. a pure (order-preserving) rescale of
    the singular values, or ``W_C = Q_l W_P Q_r`` with ``Q_l U_P = U_P A``, ``Q_r^T V_P = V_P A``.
    Left and right vectors come from one SVD each, so their signs stay paired.
    """
    (U_P, _, V_P), (U_C, _, V_C) = svd_P, svd_C
    Q_u = U_P[:, :r].T @ U_C[:, :r]
    Q_v = V_P[:, :r].T @ V_C[:, :r]
    return float(torch.linalg.matrix_norm(Q_u - Q_v) / torch.linalg.matrix_norm(Q_u))


def _gap(S: Tensor, r: int) -> float:
    """``sigma_r / sigma_{r+1}`` (1-based) of the singular values S (descending); inf when
    sigma_{r+1} is 0 or does not exist. App. C caveat: a gap near 1 means the top-r subspace is
    ill-defined at this rank."""
    if r >= S.numel() or S[r] == 0:
        return math.inf
    return float(S[r - 1] / S[r])


def _angle_stats(prefix: str, angles: Tensor) -> dict[str, float]:
    return {f"{prefix}_mean": float(angles.mean()), f"{prefix}_max": float(angles.max())}


def module_geometry(
    W0: Tensor, keep: Tensor | Sequence[int], W_comp: Tensor, r: int, value_proj: Tensor | None = None
) -> dict[str, float]:
    """App. C measurements for one pruned module.

    ``W0`` (d_out x d_in) original weight; ``keep`` kept input columns (k indices);
    ``W_comp`` (d_out x k) compensated weight; ``r`` frame rank (r_p = 16 for o_proj, 64 for
    down_proj in App. C); ``value_proj`` (k x d_model) the pruned v_proj already expanded to the
    query-head layout (see ``expand_kv_rows``), o_proj only.

    Returns angles in degrees (``angle_OP_*``, ``angle_OC_*``, ``angle_PC_*``; mean and max of
    the r principal angles), ``penalty_P`` / ``penalty_C`` (Sec. 4.5 penalty at the pruned and
    at the compensated frame, anchor ``O``; NaN without ``value_proj``), ``discrepancy``
    (P -> C, ``_discrepancy``), ``spectral_gap`` of ``W_K`` at r (``_gap``), and ``r``, ``k``.
    """
    W0 = _f64(W0)
    keep_t = torch.as_tensor(keep, dtype=torch.long).cpu()
    W_K = W0[:, keep_t]
    W_C = _f64(W_comp)
    if W_C.shape != W_K.shape:
        raise ValueError(f"W_comp has shape {tuple(W_C.shape)}, expected W0[:, keep] shape {tuple(W_K.shape)}")
    _check_rank(W_K, r)
    _check_rank(W0, r)
    # one SVD per matrix (they dominate the cost on 8B-size layers in float64)
    svd_K, svd_C = _svd(W_K), _svd(W_C)
    O = orth(_svd(W0)[2][keep_t, :r])  # noqa: E741  (App. C's frame names: O, P, C)
    P = svd_K[2][:, :r]
    C = svd_C[2][:, :r]
    out: dict[str, float] = {"r": float(r), "k": float(W_K.shape[1])}
    out |= _angle_stats("angle_OP", principal_angles(O, P))
    out |= _angle_stats("angle_OC", principal_angles(O, C))
    out |= _angle_stats("angle_PC", principal_angles(P, C))
    if value_proj is not None:
        V = _f64(value_proj)
        if V.shape[0] != W_K.shape[1]:
            raise ValueError(f"value_proj has {V.shape[0]} rows, expected k={W_K.shape[1]} (query-head layout)")
        U_v = top_left_frame(V, r)
        out["penalty_P"] = projector_penalty(P, O, U_v)
        out["penalty_C"] = projector_penalty(C, O, U_v)
    else:
        out["penalty_P"] = math.nan
        out["penalty_C"] = math.nan
    out["discrepancy"] = _discrepancy(svd_K, svd_C, r)
    out["spectral_gap"] = _gap(svd_K[1], r)
    return out


def _median(xs: list[float]) -> float:
    return float(statistics.median(xs)) if xs else math.nan


def summarize_geometry(rows: Iterable[Mapping[str, float]]) -> dict[str, float]:
    """App. C style summary of per-(layer, module) rows from ``module_geometry``.

    Each row needs a ``module`` name (e.g. ``o_proj`` / ``down_proj``) plus the keys of
    ``module_geometry``. Returns a flat dict:

    * per module ``m``: ``m.n``, ``m.angle_OP_mean`` (mean over layers of the per-layer mean
      O-P angle), ``m.angle_OP_min`` / ``m.angle_OP_max`` (span of the per-layer means),
      ``m.angle_OC_mean``, ``m.n_OC_gt_OP``, ``m.discrepancy_mean`` / ``m.discrepancy_max``;
    * overall: ``n_module_layers``, ``n_OC_gt_OP`` (layers where mean O-C > mean O-P),
      ``discrepancy_mean`` / ``discrepancy_max``, and over rows with finite penalties
      ``penalty_P_median`` / ``penalty_P_min`` / ``penalty_P_max``, ``penalty_reduction_median`` /
      ``penalty_reduction_max`` (factor ``penalty_P / penalty_C``; inf when penalty_C is 0,
      rows with both 0 are skipped), ``n_penalty``.
    """
    rows = list(rows)
    out: dict[str, float] = {"n_module_layers": float(len(rows))}
    modules = sorted({str(r["module"]) for r in rows})
    for m in modules:
        sub = [r for r in rows if str(r["module"]) == m]
        op = [float(r["angle_OP_mean"]) for r in sub]
        oc = [float(r["angle_OC_mean"]) for r in sub]
        disc = [float(r["discrepancy"]) for r in sub]
        out[f"{m}.n"] = float(len(sub))
        out[f"{m}.angle_OP_mean"] = sum(op) / len(op)
        out[f"{m}.angle_OP_min"] = min(op)
        out[f"{m}.angle_OP_max"] = max(op)
        out[f"{m}.angle_OC_mean"] = sum(oc) / len(oc)
        out[f"{m}.n_OC_gt_OP"] = float(sum(c > p for c, p in zip(oc, op, strict=True)))
        out[f"{m}.discrepancy_mean"] = sum(disc) / len(disc)
        out[f"{m}.discrepancy_max"] = max(disc)
    out["n_OC_gt_OP"] = float(sum(float(r["angle_OC_mean"]) > float(r["angle_OP_mean"]) for r in rows))
    disc = [float(r["discrepancy"]) for r in rows]
    out["discrepancy_mean"] = sum(disc) / len(disc) if disc else math.nan
    out["discrepancy_max"] = max(disc) if disc else math.nan
    pen_p, factors = [], []
    for r in rows:
        p, c = float(r.get("penalty_P", math.nan)), float(r.get("penalty_C", math.nan))
        if not (math.isfinite(p) and math.isfinite(c)):
            continue
        pen_p.append(p)
        if c > 0:
            factors.append(p / c)
        elif p > 0:
            factors.append(math.inf)
    out["n_penalty"] = float(len(pen_p))
    out["penalty_P_median"] = _median(pen_p)
    out["penalty_P_min"] = min(pen_p) if pen_p else math.nan
    out["penalty_P_max"] = max(pen_p) if pen_p else math.nan
    out["penalty_reduction_median"] = _median(factors)
    out["penalty_reduction_max"] = max(factors) if factors else math.nan
    return out
