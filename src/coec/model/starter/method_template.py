"""My compensation method: a template (written by ``coec tiny-model``; docs/adding-a-method.md).

This file alone, named in config.yaml's ``plugins``, adds the method ``row_scale`` to every stage
of the workflow: the config checks, the compensate jobs, Table 1. Rename it, change ``solve``,
keep the shape of the file.

row_scale keeps the pruned module's kept columns ``W0[:, K]`` and rescales each output row i by
the factor that minimises that row's output error on the calibration inputs,

    s_i* = <(W0 G)[i, K], W0[i, K]> / <W0[i, K] G[K, K], W0[i, K]>,

shrunk towards 1 by the option ``shrink`` (shrink 1: prune-only, W0[:, K] itself).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from coec.api import METHODS, CommonOptions, Compensation, Method, Problem, number, opt


@dataclass(frozen=True)
class RowScaleOptions(CommonOptions):
    """row_scale: each output row of W0[:, K] times its error-optimal scale."""

    # opt(default, the line the options page prints, the check of every given value, group)
    shrink: float = opt(0.0, "s_i = (1 - shrink) s_i* + shrink", number(0.0, 1.0), "method")


def solve(problem: Problem, options: RowScaleOptions) -> Compensation:
    """The compensated module: weight (d_out, k) and, here, no bias.

    problem.W0 (d_out, d_in) the original weight; problem.keep (k,) the kept input columns;
    problem.metric.G (d_in, d_in) the calibration Gram, normalised and PSD-checked (float64;
    formed because the method reads it: ``Method.needs_metric``, true by default);
    problem.dtype the solve dtype. What is returned is checked before anything is written:
    weight (d_out, k), bias (d_out,) or None, finite values, ``info`` of JSON values.
    """
    assert problem.metric is not None  # Method.needs_metric
    G = problem.metric.G.to(problem.dtype)
    keep = problem.keep
    W0 = problem.W0.to(problem.dtype)
    WK = W0[:, keep]  # (d_out, k)
    num = ((W0 @ G[:, keep]) * WK).sum(1)  # (d_out,)
    den = ((WK @ G[keep][:, keep]) * WK).sum(1)  # (d_out,)
    s_opt = torch.where(den > 0, num / den.clamp_min(torch.finfo(den.dtype).tiny), torch.ones_like(den))
    s = (1.0 - options.shrink) * s_opt + options.shrink
    # info: anything JSON (numbers, strings, lists, dicts); compensate() adds the errors before
    # and after on the same metric, App. B's outcome and the solve time
    return Compensation(weight=s[:, None] * WK, info={"scale_mean": float(s.mean()), "scale_min": float(s.min())})


METHODS.register(Method(name="row_scale", options=RowScaleOptions, solve=solve, doc=RowScaleOptions.__doc__ or ""))
