"""Which units a step keeps: FLAP's fluctuation scores (eq. 5) of the remaining KV groups and
MLP channels, kept either uniformly per layer or by FLAP's adaptive structure AL-AM (all
layers ranked together under one parameter budget)."""

from __future__ import annotations

import torch
from torch import nn

from coec.calibrate.layer_pass import channel_sumsq
from coec.iterative.state import PruneState, output_module, unit_params
from coec.iterative.stats import Stats
from coec.model.arch import MODULES, AttnShape
from coec.select.scores import column_scores, group_scores, top_k_sorted


def layer_scores(layer: nn.Module, stats: dict[str, Stats]) -> tuple[torch.Tensor, torch.Tensor]:
    """FLAP column scores (eq. 5) of the current o_proj and down_proj inputs, (k_o,), (k_d,),
    on the CPU (computed where the weight lives; the Gram may be full or its diagonal)."""
    out = []
    for m in MODULES:
        st, w = stats[m], output_module(layer, m).weight.detach()
        out.append(column_scores("flap", w, channel_sumsq(st).to(w.device), st["sum"].to(w.device), st["count"]).cpu())
    return out[0], out[1]


def uniform_keep(
    o_scores: torch.Tensor, d_scores: torch.Tensor, geom: AttnShape, n_groups: int, n_channels: int
) -> tuple[list[int], list[int]]:
    """Local keep sets of one layer: the ``n_groups`` best KV groups (group score = sum of its
    o_proj column scores, as ``select.select_layer``) and the ``n_channels`` best channels."""
    if n_groups > geom.n_kv or n_channels > d_scores.numel():
        raise ValueError(
            f"the schedule asks to keep {n_groups} groups / {n_channels} channels but "
            f"only {geom.n_kv} / {d_scores.numel()} remain (ratios must not decrease)"
        )
    return (top_k_sorted(group_scores(o_scores, geom), n_groups), top_k_sorted(d_scores, n_channels))


def standardise(x: torch.Tensor) -> torch.Tensor:
    """(x - mean) / std over one layer's module (FLAP); zeros when std is 0 or undefined."""
    x = x.double()
    if x.numel() < 2:
        return torch.zeros_like(x)
    sd = x.std()
    if not torch.isfinite(sd) or sd == 0:
        return torch.zeros_like(x)
    return (x - x.mean()) / sd


def alam_keep(
    scores: list[tuple[torch.Tensor, torch.Tensor]],
    geoms: list[AttnShape],
    state: PruneState,
    d_model: int,
    ratio: float,
) -> list[tuple[list[int], list[int]]]:
    """FLAP AL-AM: KV groups and channels of all layers ranked together.

    Attention: column scores squared, standardised per layer, averaged over each group's columns;
    MLP: channel scores standardised per layer. Units sorted by score (descending, stable); the
    kept prefix is the one whose parameter count (group 2·hd·(g+1)·d, channel 3·d) is closest to
    (1 - ratio) × the ORIGINAL prunable parameters. Every layer keeps >= 1 group and channel.
    Returns local keep sets per layer.
    """
    wg, wc = unit_params(state.geom, d_model)
    budget = (1.0 - ratio) * len(scores) * (state.geom.n_kv * wg + state.d_ff * wc)
    vals, weights, owner = [], [], []
    for i, ((o, d), geom) in enumerate(zip(scores, geoms, strict=True)):
        g = standardise(o**2).view(geom.n_kv, -1).mean(1)
        vals += [g, standardise(d)]
        weights += [
            torch.full((geom.n_kv,), float(wg), dtype=torch.float64),
            torch.full((d.numel(),), float(wc), dtype=torch.float64),
        ]
        owner += [(i, 0, j) for j in range(geom.n_kv)] + [(i, 1, j) for j in range(d.numel())]
    v, w = torch.cat(vals), torch.cat(weights)
    order = torch.sort(-v, stable=True).indices
    prefix = torch.cat([torch.zeros(1, dtype=torch.float64), torch.cumsum(w[order], 0)])
    t = int(torch.argmin((prefix - budget).abs()))
    kept: list[list[list[int]]] = [[[], []] for _ in scores]
    for idx in order[:t].tolist():
        i, kind, j = owner[idx]
        kept[i][kind].append(j)
    for i, ((o, d), geom) in enumerate(zip(scores, geoms, strict=True)):
        if not kept[i][0]:
            kept[i][0] = [int(torch.argmax(standardise(o**2).view(geom.n_kv, -1).mean(1)))]
        if not kept[i][1]:
            kept[i][1] = [int(torch.argmax(d))]
    return [(sorted(g), sorted(c)) for g, c in kept]
