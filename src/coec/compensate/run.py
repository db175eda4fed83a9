"""``compensate``: one pruned module compensated by a registered method (the package's public
entry, ``from coec.compensate import compensate``; see ``coec.compensate``'s docstring)."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import torch

from coec.compensate.errors import MetricParts, Moments, residual_errors
from coec.compensate.gram_check import GramCheck
from coec.compensate.methods.base import CommonOptions, Compensation, Method
from coec.compensate.options import Resolved, resolve
from coec.compensate.options import method as _method
from coec.compensate.output_checks import check_cast, check_output, jsonable
from coec.compensate.problem import Problem, prepare
from coec.compensate.problem_checks import check_problem

#: What a method that reports no iterations has in ``info`` (the keys of coec's loop).
_NO_LOOP: dict[str, Any] = dict(
    rounds=0,
    inner_steps=0,
    inner_steps_per_round=[],
    objective_history=[],
    gcv_lambdas=[],
    gcv_lambdas_rel=[],
    gcv_at_grid_end={"low": 0, "high": 0},
    kappa_clamped=0,
)


def _with_errors(problem: Problem, m: Method, out: Compensation) -> dict[str, Any]:
    """``info`` of a method that reports no errors of its own: App. B's outcome, the method's
    info, the errors before and after on the metric (``errors.residual_errors``: the output
    energy, the pruned block, and for a weight other than ``W0[:, K]`` one product of its
    residual; float64), the loop keys. With the calibration's Gram check, a method that keeps
    ``W0[:, K]`` (none, bias) never forms the whole float64 metric."""
    info: dict[str, Any] = {
        "method": m.name,
        "compute_dtype": str(problem.dtype).replace("torch.", ""),
        "device": str(problem.device),
        "gram_psd": problem.psd,
        **out.info,
    }
    n = problem.n_tokens  # the Gram is scale * G over n tokens: G over n / scale
    assert problem.energy is not None and problem.scale is not None  # prepare(..., errors=True)
    parts = MetricParts(energy=problem.energy, block=problem.metric_block, whole=problem.metric_whole)
    info.update(
        residual_errors(
            problem.W0,
            parts,
            problem.keep,
            out.weight,
            out.bias,
            Moments(problem.mean, n / problem.scale if n is not None else None),
        )
    )
    info.setdefault("scale_skipped", 0)
    info.setdefault("svd_fallbacks", problem.fallbacks)
    info.update(_NO_LOOP)
    return info


def _method_and_options(method: str | Resolved, options: dict[str, Any]) -> tuple[Method, CommonOptions]:
    """The method and its checked options: a ``Resolved`` pair as given, else the named method
    with ``options`` resolved (unknown option, bad values, options that cannot work together
    raise ValueError)."""
    if not isinstance(method, Resolved):
        return _method(method), resolve(method, options)
    if options:
        raise ValueError(f"method {method.method.name!r} comes resolved: its options cannot be given by name too")
    return method.method, method.options


def compensate(  # noqa: PLR0913 - the public entry: the problem (W0, G, mean, keep), the method, its optional data keyword-only
    W0: torch.Tensor,
    gram: torch.Tensor,
    mean: torch.Tensor | None,
    keep: Any,
    method: str | Resolved,
    *,
    inputs: Mapping[str, Any] | None = None,
    n_tokens: float | None = None,
    check: GramCheck | None = None,
    **options: Any,
) -> Compensation:
    """Compensate one pruned module (paper Sec. 3–4) with a registered method; see the module
    docstring. Returns ``Compensation`` with weight (d_out, k) and bias (d_out,) | None in W0's
    dtype/device and a JSON-serialisable ``info`` (relerr_before / relerr_after, rounds,
    inner_steps, gcv_lambdas, objective_history, seconds, svd_fallbacks, ...).
    ``method``: a registered name with its options by name (``**options``), or a
    ``options.Resolved`` method and options, resolved once by the caller (the compensate stage).
    Raises ValueError naming the problem for bad input or an unknown method/option, and
    ``output_checks.MethodOutputError`` (a ValueError) when the method returns a weight or bias of
    the wrong shape, non-finite values or an ``info`` that is not JSON.
    """
    t0 = time.perf_counter()
    m, o = _method_and_options(method, options)
    keep = check_problem(W0, gram, mean, keep, m, n_tokens)
    dev = W0.device
    data = Problem(
        W0=W0,
        gram=gram.to(dev),
        mean=mean.to(dev) if mean is not None else None,
        keep=keep.to(dev),
        n_tokens=n_tokens,
        inputs=dict(inputs or {}),
        dtype=m.dtype(o, dev),
    )
    problem = prepare(data, check, metric=m.needs_metric, errors=not m.reports_errors)
    if m.check_data is not None:
        m.check_data(problem, o)
    out = m.solve(problem, o)
    check_output(out, m.name, problem.d_out, problem.k)  # before anything uses it (MethodOutputError)
    info = dict(out.info) if m.reports_errors else _with_errors(problem, m, out)
    info["seconds"] = time.perf_counter() - t0
    weight = out.weight.to(W0.device, W0.dtype).contiguous()
    bias = out.bias.to(W0.device, W0.dtype) if out.bias is not None else None
    for name, t, src in (("weight", weight, out.weight), ("bias", bias, out.bias)):
        if t is not None and src is not None and src.dtype != W0.dtype:
            check_cast(m.name, name, t, W0.dtype)
    return Compensation(weight=weight, bias=bias, info=jsonable(info))
