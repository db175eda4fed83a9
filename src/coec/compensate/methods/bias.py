"""bias: FLAP's bias compensation (An et al. 2023): keep ``W0[:, K]`` and add the mean output of
the pruned columns as a bias, ``b = W0[:, P] mean[P]``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from coec.compensate.methods import METHODS
from coec.compensate.methods.base import CommonOptions, Compensation, Method

if TYPE_CHECKING:
    import torch

    from coec.compensate.problem import Problem


@dataclass(frozen=True)
class BiasOptions(CommonOptions):
    """bias: FLAP's bias compensation ``b = W0[:, P] mean[P]``."""


def flap_bias(W0: torch.Tensor, mean: torch.Tensor, keep: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Weight ``W0[:, K]`` (d_out, k) and bias ``W0[:, P] mean[P]`` (d_out,), P the pruned columns."""
    import torch  # deferred: keeps the job boundary torch-free

    mask = torch.ones(W0.shape[1], dtype=torch.bool, device=W0.device)
    mask[keep] = False
    return W0[:, keep], W0[:, mask] @ mean.to(W0.dtype)[mask]


def solve(problem: Problem, options: BiasOptions) -> Compensation:
    assert problem.mean is not None  # Method.needs_mean
    W, b = flap_bias(problem.W0.to(problem.dtype), problem.mean.to(problem.dtype), problem.keep)
    return Compensation(weight=W, bias=b)


METHOD = METHODS.register(
    Method(
        name="bias",
        options=BiasOptions,
        solve=solve,
        doc=BiasOptions.__doc__ or "",
        needs_mean=True,
        needs_n_tokens=True,
        needs_metric=False,
    )
)
