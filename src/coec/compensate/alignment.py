"""The anchored inter-layer alignment penalty of an o_proj (paper Sec. 4.5).

The anchor is the top-``rank`` right singular subspace of the UNPRUNED weight, restricted to the
kept columns; U_v the top left singular vectors of the pruned value projection. The penalty
(``alignment_value``) and its gradient (``alignment_grad``) are functions of the top-``rank``
rows ``Rp`` of the compensated weight's right frame.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from coec.compensate.linalg import polar, top_singular_vectors
from coec.compensate.profiling import traced


@dataclass(frozen=True)
class AlignmentSettings:
    """The anchored alignment (Sec. 4.5), each field named as coec's option: the anchor's rank
    ``anchor_rank`` r_p, the penalty ``align`` ("projector" | "angle") and its weight
    ``align_lambda`` lambda_a (0: none)."""

    anchor_rank: int
    align: str = "projector"
    align_lambda: float = 0.0


@dataclass
class Alignment:
    """Precomputed alignment data for one o_proj (paper Sec. 4.5).

    kind: "projector" (paper) or "angle" (principal-angle variant, see ``alignment_value``).
    Va (k, rp): anchor frame ``orth(V_full[K, :rp])`` (polar orthonormalisation; same subspace
    as QR, which is all either penalty uses).
    Uv (k, rp) or None: leading left singular vectors of the pruned, query-layout v_proj.
    C (rp, rp) or None: ``Uv^T Pi_anchor Uv = (Va^T Uv)^T (Va^T Uv)``.
    """

    kind: str
    rank: int
    Va: torch.Tensor
    Uv: torch.Tensor | None = None
    C: torch.Tensor | None = None


def alignment_setup(
    W0: torch.Tensor,
    keep: torch.Tensor,
    value_proj: torch.Tensor | None,
    settings: AlignmentSettings,
    record: list[str] | None = None,
    factor: str = "svd",
) -> Alignment:
    """Build the anchor from the UNPRUNED weight W0 (d_out, d_in) and U_v from value_proj (k, d_model).

    anchor = orth(V_full[K, :]) with V_full the top-``rank`` (``settings.anchor_rank``) right
    singular vectors of W0 (Sec. 4.5); the penalty ``settings.align``.
    ``factor``: how the top singular vectors are found, "svd" or "eigh" (``top_singular_vectors``;
    both penalties depend only on the two top-``rank`` subspaces).
    """
    rank, kind = settings.anchor_rank, settings.align
    Vtop = top_singular_vectors(W0, rank, "right", factor, record)
    Va = polar(Vtop[keep], record)  # (k, rp)
    Uv = C = None
    if value_proj is not None:
        Uv = top_singular_vectors(value_proj.to(W0.dtype), rank, "left", factor, record)
        B = Va.mT @ Uv
        C = B.mT @ B
    if kind == "projector" and Uv is None:
        raise ValueError("align='projector' needs value_proj (k x d_model)")
    return Alignment(kind=kind, rank=rank, Va=Va, Uv=Uv, C=C)


def _projector_data(al: Alignment) -> tuple[torch.Tensor, torch.Tensor]:
    if al.Uv is None or al.C is None:
        raise ValueError("the projector penalty needs U_v (the alignment was set up without value_proj)")
    return al.Uv, al.C


def _check_kind(kind: str) -> None:
    if kind not in ("projector", "angle"):
        raise ValueError(f"unknown align kind {kind!r}; expected 'projector' or 'angle'")


@traced("coec.align.value")
def alignment_value(Rp: torch.Tensor, al: Alignment, kind: str | None = None) -> float:
    """Alignment penalty of the top-rp rows ``Rp`` (rp, k) of R (``kind``: al's by default).

    projector (paper Sec. 4.5): ``A = ||Uv^T (Rp^T Rp - Va Va^T) Uv||_F^2 / rp^2``, with
    ``M = Rp Uv`` and ``E = M^T M - C``: ``A = ||E||_F^2 / rp^2``.

    angle (option): mean squared sine of the principal angles theta_i between the row space of
    Rp (top-rp right singular subspace of the compensated weight) and the anchor subspace,
    ``A = (1/rp) sum_i sin^2 theta_i = 1 - ||Rp Va||_F^2 / rp = ||Rp^T Rp - Va Va^T||_F^2 / (2 rp)``.
    Why: App. C finds the projector penalty at ~1e-7 while the principal angles stay at ~22 deg.
    Any subspace metric is invariant to rotations inside the subspace (principal angles too,
    despite App. C's wording); what the paper's penalty misses is everything outside span(Uv),
    because the Uv^T (.) Uv sandwich keeps only an rp x rp block. This variant drops the sandwich,
    so it targets exactly the angles App. C measures; it needs no Uv. It depends only on the
    top-rp subspace, not on the order of the rows inside it. Values are formed in float64 (they
    are small differences).
    """
    kind = kind or al.kind
    _check_kind(kind)
    rp = al.rank
    f64 = torch.float64
    if kind == "projector":
        Uv, C = _projector_data(al)
        M = Rp.to(f64) @ Uv.to(f64)
        E = M.mT @ M - C.to(f64)
        return float((E * E).sum()) / rp**2
    B = Rp.to(f64) @ al.Va.to(f64)  # (rp, rp): singular values are cos(theta_i)
    return 1.0 - float((B * B).sum()) / rp


@traced("coec.align.value")  # the penalty's range covers its value and its gradient
def alignment_grad(Rp: torch.Tensor, al: Alignment) -> torch.Tensor:
    """Euclidean gradient (rp, k), in Rp's dtype, of ``al``'s penalty (``alignment_value``) with
    respect to the top-rp rows ``Rp`` of R: projector ``dA/dRp = 4 M E Uv^T / rp^2``; angle
    ``dA/dRp = -(2/rp) (Rp Va) Va^T``."""
    _check_kind(al.kind)
    rp = al.rank
    f64 = torch.float64
    if al.kind == "projector":
        Uv, C = _projector_data(al)
        M = Rp.to(f64) @ Uv.to(f64)
        E = M.mT @ M - C.to(f64)
        return ((4.0 / rp**2) * (M @ E)).to(Rp.dtype) @ Uv.mT
    B = Rp.to(f64) @ al.Va.to(f64)
    return ((-2.0 / rp) * B).to(Rp.dtype) @ al.Va.mT
