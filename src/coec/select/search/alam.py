"""Allocations a width search is compared with, under the same budget: uniform widths
(``SearchSpace.uniform``, built by ``coec.select.search.budget.build_space``) and FLAP's adaptive
structure AL-AM (arXiv 2312.11983) as an allocation of per-unit scores.

AL-AM (as ``coec.iterative.structure.alam_keep`` ranks units): attention scores are the o_proj
column scores squared, standardised over the layer and averaged over each KV group's columns; MLP
scores are the down_proj channel scores standardised over the layer. Here a unit's level steps
carry the scores: the step from level j-1 to j holds the unit's ranked units levels[j-1] to
levels[j] - 1 (best first) and scores their mean (a block of ``channel_multiple`` channels, one
KV group). The steps of all layers are taken in one global order, best first, while the total
stays within the budget: the first step that does not fit is the global threshold. FLAP keeps the
prefix whose parameter count is closest to the budget; here the budget is a cap, so the prefix
ends below it. Every unit keeps its lowest level (FLAP keeps a group and a channel in every layer).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from coec.iterative.structure import standardise
from coec.select.search.budget import SearchSpace, Unit


def unit_scores(unit: Unit, o_scores: torch.Tensor, d_scores: torch.Tensor) -> torch.Tensor:
    """FLAP's standardised scores of a unit's KV groups (n_kv,) or channels (d_ff,)."""
    if unit.kind == "kv_groups":
        return standardise(o_scores**2).view(unit.levels[-1], -1).mean(1)
    return standardise(d_scores)


def step_scores(unit: Unit, scores: torch.Tensor) -> list[float]:
    """Score of each step of ``unit`` (level j-1 to j, j >= 1): the mean of the scores ranked
    levels[j-1]..levels[j]-1, best first; made non-increasing, so a unit's steps are taken in order."""
    if scores.numel() != unit.levels[-1]:
        raise ValueError(f"layer {unit.layer} {unit.kind}: {scores.numel()} scores for a width of {unit.levels[-1]}")
    ranked = torch.sort(scores.double(), descending=True).values
    out: list[float] = []
    for a, b in zip(unit.levels, unit.levels[1:]):
        x = float(ranked[a:b].mean())
        out.append(min(x, out[-1]) if out else x)
    return out


def alam_state(space: SearchSpace, scores: Sequence[tuple[torch.Tensor, torch.Tensor]]) -> tuple[int, ...]:
    """The AL-AM allocation (module docstring) as level indices of ``space``, from each layer's
    (o_proj column scores (n_kv·g·hd,), down_proj channel scores (d_ff,)), as FLAP computes them
    (``coec.iterative.structure.layer_scores``)."""
    layers = {u.layer for u in space.units}
    if len(scores) != len(layers):
        raise ValueError(f"AL-AM needs the scores of {len(layers)} layers, got {len(scores)}")
    steps = sorted(
        (-x, k, j)
        for k, u in enumerate(space.units)
        for j, x in enumerate(step_scores(u, unit_scores(u, *scores[u.layer])), start=1)
    )
    s = [0] * len(space.units)
    cost = space.cost(s)
    for _, k, j in steps:
        costs = space.units[k].costs
        if cost + costs[j] - costs[j - 1] > space.budget:
            break
        cost += costs[j] - costs[j - 1]
        s[k] = j
    return tuple(s)
