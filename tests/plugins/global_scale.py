"""A compensation method defined outside the package, as a researcher would write one: this file
alone, named in a config's ``plugins``, adds method ``global_scale`` to every stage of the
workflow (tests/workflow/test_registry_plugins.py runs it through the trimmed workflow to a Table 1 row).

global_scale keeps the pruned columns and rescales them by the one factor that minimises the
output error, ``s* = <Gyx, W_K> / <W_K, W_K Gxx>`` (RCPU's scale without its rotation), shrunk
towards 1 by ``shrink``.
"""

from __future__ import annotations

from dataclasses import dataclass

from coec.api import METHODS, CommonOptions, Compensation, Method, Problem, number, opt


@dataclass(frozen=True)
class GlobalScaleOptions(CommonOptions):
    """global_scale (a test plug-in): ``s W0[:, K]`` with the error-optimal scale s*."""

    shrink: float = opt(0.0, "s = (1 - shrink) s* + shrink", number(0.0, 1.0), "method")


def solve(problem: Problem, options: GlobalScaleOptions) -> Compensation:
    G = problem.metric.G.to(problem.dtype)  # the normalised, PSD-checked Gram
    keep = problem.keep
    WK = problem.W0.to(problem.dtype)[:, keep]
    Gyx = problem.W0.to(problem.dtype) @ G[:, keep]
    den = float(((WK @ G[keep][:, keep]) * WK).sum())
    s_opt = float((Gyx * WK).sum()) / den if den > 0 else 1.0
    s = (1.0 - options.shrink) * s_opt + options.shrink
    return Compensation(weight=s * WK, info={"scale": s})


METHODS.register(
    Method(name="global_scale", options=GlobalScaleOptions, solve=solve, doc=GlobalScaleOptions.__doc__ or "")
)
