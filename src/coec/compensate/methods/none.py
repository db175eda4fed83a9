"""none: prune only, ``W0[:, K]`` (Wanda-sp)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from coec.compensate.methods import METHODS
from coec.compensate.methods.base import CommonOptions, Compensation, Method

if TYPE_CHECKING:
    from coec.compensate.problem import Problem


@dataclass(frozen=True)
class NoneOptions(CommonOptions):
    """none: prune only, ``W0[:, K]`` (Wanda-sp)."""


def solve(problem: Problem, options: NoneOptions) -> Compensation:
    """``W0[:, K]`` (d_out, k) in the solve dtype, no bias."""
    return Compensation(weight=problem.W0.to(problem.dtype)[:, problem.keep])


METHOD = METHODS.register(
    Method(name="none", options=NoneOptions, solve=solve, doc=NoneOptions.__doc__ or "", needs_metric=False)
)
