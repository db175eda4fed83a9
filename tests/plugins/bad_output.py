"""A plug-in whose ``solve`` returns what no module can hold, one fault per ``fault`` option, as
two methods: ``bad_output`` (errors computed by ``compensate``) and ``bad_output_own``
(``reports_errors=True``: it fills its own). tests/unit/test_compensate_output_checks.py and
tests/integration/test_compensate_output_checks_cli.py check that each is stopped before anything is written.

fault: ``none`` (W0[:, K], a valid output), ``shape`` (the whole (d_out, d_in) weight), ``nan``
(one NaN), ``bias`` (a bias one entry short), ``info`` (a tensor in ``info``), ``overflow``
(a float64 weight beyond the module's float32 range).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from coec.api import METHODS, CommonOptions, Compensation, Method, Problem, choice, opt

FAULTS = ("none", "shape", "nan", "bias", "info", "overflow")


@dataclass(frozen=True)
class BadOutputOptions(CommonOptions):
    """bad_output (a test plug-in): returns a faulty compensation."""

    fault: str = opt("shape", "which fault", choice(*FAULTS), "method")


def solve(problem: Problem, options: BadOutputOptions) -> Compensation:
    W = problem.W0.to(problem.dtype)
    weight, bias, info = W[:, problem.keep].clone(), None, {"fault": options.fault}
    if options.fault == "shape":
        weight = W.clone()
    elif options.fault == "nan":
        weight[0, 0] = float("nan")
    elif options.fault == "bias":
        bias = torch.zeros(problem.d_out - 1, dtype=problem.dtype, device=problem.device)
    elif options.fault == "info":
        info["scale"] = torch.ones(())
    elif options.fault == "overflow":
        weight = weight.double()
        weight[0, 0] = 1e300
    return Compensation(weight=weight, bias=bias, info=info)


for name, own in (("bad_output", False), ("bad_output_own", True)):
    METHODS.register(
        Method(name=name, options=BadOutputOptions, solve=solve, doc=BadOutputOptions.__doc__ or "", reports_errors=own)
    )
