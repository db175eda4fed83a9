"""rcpu: RCPU's compensation (Haruta et al. 2026): the left rotation ``polar(Gyx W_K^T)`` of the
kept columns and one global scale."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from coec.compensate.methods import METHODS
from coec.compensate.methods.base import CommonOptions, Compensation, Method

if TYPE_CHECKING:
    import torch

    from coec.compensate.problem import Problem


@dataclass(frozen=True)
class RcpuOptions(CommonOptions):
    """rcpu: left rotation polar(Gyx W_K^T) and the global scale s* (RCPU)."""


def rotate_and_scale(
    W0: torch.Tensor, G: torch.Tensor, keep: torch.Tensor, record: list[str] | None = None
) -> tuple[torch.Tensor, dict[str, Any]]:
    """RCPU: ``Q = polar(Gyx W_K^T)`` in O(d_out), ``W = Q W_K``, global scale
    ``s* = <Gyx, W> / <W, W Gxx>`` applied only when the denominator is positive (App. B).

    W0 (d_out, d_in), G (d_in, d_in), keep (k,). Returns (s* Q W_K (d_out, k), info with
    ``scale``, ``scale_ok``, ``Q`` (d_out, d_out)); SVD fallbacks are appended to ``record``.
    """
    from coec.compensate.linalg import polar  # deferred: keeps the job boundary torch-free

    WK = W0[:, keep]
    Gyx = W0 @ G[:, keep]
    Gxx = G[keep[:, None], keep]
    Q = polar(Gyx @ WK.mT, record)
    W = Q @ WK
    num = float((Gyx * W).sum())
    den = float(((W @ Gxx) * W).sum())
    ok = den > 0
    s = num / den if ok else 1.0
    return s * W, {"scale": s, "scale_ok": ok, "Q": Q}


def solve(problem: Problem, options: RcpuOptions) -> Compensation:
    metric = problem.metric
    assert metric is not None  # Method.needs_metric
    W, ri = rotate_and_scale(problem.W0.to(problem.dtype), metric.G.to(problem.dtype), problem.keep, metric.fallbacks)
    return Compensation(
        weight=W,
        info={"scale": ri["scale"], "scale_skipped": 0 if ri["scale_ok"] else 1, "svd_fallbacks": metric.fallbacks},
    )


METHOD = METHODS.register(Method(name="rcpu", options=RcpuOptions, solve=solve, doc=RcpuOptions.__doc__ or ""))
