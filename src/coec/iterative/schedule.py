"""The pruning schedule rho_1 < ... < rho_S = rho (docs/iterative.md, eq. 11): cumulative
ratios of the ORIGINAL width of every layer."""

from __future__ import annotations

from itertools import pairwise

from coec.select.scores import check_ratio


def make_schedule(ratio: float, steps: int | None = None, step: float | None = None) -> list[float]:
    """Cumulative ratios of the ORIGINAL width: rho·s/S for s = 1..S (``steps``), or
    δ, 2δ, ... capped at rho (``step`` δ); rounded to 6 decimals."""
    check_ratio(ratio)
    if steps is not None and step is None:
        if int(steps) < 1:
            raise ValueError(f"steps must be >= 1, got {steps}")
        return [round(ratio * s / int(steps), 6) for s in range(1, int(steps) + 1)]
    if step is None or steps is not None:
        raise ValueError("give exactly one of steps (S) or step (δ)")
    if not 0 < step < 1:
        raise ValueError(f"step must lie in (0, 1), got {step}")
    out: list[float] = []
    s = 1
    while round(s * step, 6) < ratio - 1e-9:
        out.append(round(s * step, 6))
        s += 1
    return out + [round(ratio, 6)]


def check_schedule(schedule: list[float]) -> None:
    """A schedule is non-empty, every ratio valid (``select.check_ratio``), none decreasing."""
    if not schedule:
        raise ValueError("empty pruning schedule")
    for r in schedule:
        check_ratio(r)
    if any(b < a for a, b in pairwise(schedule)):
        raise ValueError(f"pruning schedule must not decrease: {schedule}")
