"""Beyond the paper: a held-out blend of a base compensation (COEC) and ridge, with an intercept
(docs/blend.md); its options and entry. The numerics, with the three parts and their limits, are
``coec.compensate.blending``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from coec.compensate.inputs import OtherCalibration, OtherCell
from coec.compensate.methods import METHODS
from coec.compensate.methods.base import CommonOptions, Compensation, Method
from coec.compensate.validators import boolean, choice, name_or_none, number, opt

if TYPE_CHECKING:
    from coec.compensate.problem import Problem


@dataclass(frozen=True)
class BlendOptions(CommonOptions):
    """blend (beyond the paper): a base compensation's weights (COEC) and ridge, each with the best
    intercept, blended per module by the beta in [0, 1] that minimises the error on held-out
    calibration tokens (docs/blend.md)."""

    base: str = opt(
        "coec",
        "the `compensations` entry whose weights are blended (its cell is an input)",
        name_or_none(),
        "method",
        evidence="method design (docs/blend.md); config.yaml's blend-pcg blends coec-pcg",
    )
    holdout: str | None = opt(
        None,
        "the `calibration` entry (disjoint_from the cell's) whose Grams choose beta; needed by mix holdout",
        name_or_none(allow_none=True),
        "method",
        evidence="method design (docs/blend.md): the held-out Grams that fit beta; config.yaml's blend sets it",
    )
    mix: str = opt(
        "holdout",
        "holdout: beta fitted on the held-out Grams | base: beta 0 | ridge: beta 1",
        choice("holdout", "base", "ridge"),
        "method",
        evidence="each value is a step of the blend ladder (docs/blend.md; config.yaml's blend, "
        "coec-intercept, ridge-intercept)",
    )
    intercept: bool = opt(
        True,
        "add the best bias b = W0 m - W m_K (ridge on centred statistics)",
        boolean(),
        "method",
        evidence="a step of the blend ladder (docs/blend.md; config.yaml's blend-nointercept)",
    )
    ridge: float = opt(
        1e-2,
        "lambda = ridge * mean(diag(Gxx)) of the ridge end (as lstsq)",
        number(0.0),
        "method",
        evidence="default, as lstsq's (paper hyperparameter, Sec. 3.2)",
    )


def solve(problem: Problem, o: BlendOptions) -> Compensation:
    """``coec.compensate.blending.solve_blend``: the blended weight and bias, with beta and the
    held-out errors of the ends and of the blend in ``info``."""
    from coec.compensate.blending import solve_blend  # deferred: keeps the job boundary torch-free

    return solve_blend(problem, o)


def check_data(problem: Problem, o: BlendOptions) -> None:
    """The base cell's weights and the held-out statistics against the problem (raises ValueError)."""
    from coec.compensate.problem_checks import check_tensor  # deferred: keeps the job boundary torch-free

    inputs, d_out, d_in, k = problem.inputs, problem.d_out, problem.d_in, problem.k
    bw = inputs.get("base_weight")
    if bw is None:
        raise ValueError("method 'blend' requires base_weight (the base compensation's (d_out, k) weight)")
    check_tensor("base_weight", bw, 2)
    if tuple(bw.shape) != (d_out, k):
        raise ValueError(f"base_weight shape {tuple(bw.shape)} does not match (d_out, k) = ({d_out}, {k})")
    bb = inputs.get("base_bias")
    if bb is not None:
        check_tensor("base_bias", bb, 1)
        if bb.shape[0] != d_out:
            raise ValueError(f"base_bias has {bb.shape[0]} entries, expected d_out = {d_out}")
    hg = inputs.get("holdout_gram")
    if o.mix == "holdout" and hg is None:
        raise ValueError(
            "blend with mix 'holdout' requires holdout_gram, holdout_mean and holdout_count "
            "(the held-out calibration set's statistics)"
        )
    if hg is not None:
        check_tensor("holdout_gram", hg, 2)
        if tuple(hg.shape) != (d_in, d_in):
            raise ValueError(f"holdout_gram shape {tuple(hg.shape)}, expected ({d_in}, {d_in})")
        if inputs.get("holdout_mean") is None or inputs.get("holdout_count") is None:
            raise ValueError("holdout_gram needs holdout_mean and holdout_count too")
        check_tensor("holdout_mean", inputs["holdout_mean"], 1)
        if inputs["holdout_mean"].shape[0] != d_in:
            raise ValueError(f"holdout_mean has {inputs['holdout_mean'].shape[0]} entries, expected d_in = {d_in}")


METHOD = METHODS.register(
    Method(
        name="blend",
        options=BlendOptions,
        solve=solve,
        doc=BlendOptions.__doc__ or "",
        inputs=(OtherCell("base", option="base"), OtherCalibration("holdout", option="holdout")),
        needs_mean=True,
        needs_n_tokens=True,
        check_data=check_data,
    )
)
