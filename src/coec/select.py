"""Column scores and keep sets (DESIGN.md "Selection").

Scores of input column j of o_proj / down_proj with W the original weight (d_out, d_in) and
X_j the calibration activations of channel j:

    wanda_sp   ||W[:, j]|| · ||X_j||
    flap       Var(X_j) · ||W[:, j]||²                  (FLAP's WIFV)
    rcpu       ||W[:, j]|| · ||X_j|| · Var(X_j)

||X_j|| = sqrt(G_jj); Var is the unbiased token variance from Σx² (the Gram's diagonal, stored in
float64 beside the Gram: ``sumsq``), the channel sum and the token count. Attention prunes whole
KV groups with their query heads (a group's score is the sum of its o_proj columns' scores); the
MLP prunes single channels.
"""

from __future__ import annotations

import math

import torch

from .calibrate import channel_sumsq
from .models import AttnGeometry

SELECTIONS = ("wanda_sp", "flap", "rcpu")
ROUNDINGS = ("ceil", "nearest")


def channel_variance(gram_diag: torch.Tensor, total: torch.Tensor, count: int) -> torch.Tensor:
    """Unbiased per-channel variance from Σx², Σx and the token count, (d,)."""
    g = gram_diag.double()
    mean = total.double() / count
    return ((g - count * mean**2) / max(count - 1, 1)).clamp_min(0.0)


def column_scores(method: str, weight: torch.Tensor, gram_diag: torch.Tensor, total: torch.Tensor,
                  count: int) -> torch.Tensor:
    """Importance of every input column of ``weight`` (d_out, d_in) -> (d_in,) float64."""
    if method not in SELECTIONS:
        raise ValueError(f"unknown selection {method!r}; expected one of {', '.join(SELECTIONS)}")
    w_norm = weight.double().norm(dim=0)
    x_norm = gram_diag.double().clamp_min(0.0).sqrt()
    if method == "wanda_sp":
        return w_norm * x_norm
    var = channel_variance(gram_diag, total, count)
    if method == "flap":
        return var * w_norm**2
    return w_norm * x_norm * var


def n_keep(n: int, ratio: float, rounding: str = "ceil") -> int:
    """How many of ``n`` units survive pruning ratio ``ratio``.

    ceil: keep ceil((1-ratio)·n) (the paper's rule); nearest: prune round(ratio·n) (half up),
    so 3 KV groups at 30 % lose one. At least one unit is always kept.
    """
    check_ratio(ratio)
    if rounding == "ceil":
        k = math.ceil((1.0 - ratio) * n - 1e-9)
    elif rounding == "nearest":
        k = n - math.floor(ratio * n + 0.5 + 1e-9)
    else:
        raise ValueError(f"unknown rounding {rounding!r}; expected one of {', '.join(ROUNDINGS)}")
    return max(1, min(n, k))


def check_ratio(ratio: float) -> None:
    if not (0.0 < float(ratio) < 1.0):
        raise ValueError(f"pruning ratio must lie in (0, 1), got {ratio}")


def top_k_sorted(scores: torch.Tensor, k: int) -> list[int]:
    """Indices of the k highest scores (ties broken by lower index), returned ascending."""
    order = torch.sort(-scores, stable=True).indices[:k]
    return sorted(order.tolist())


def group_scores(col_scores: torch.Tensor, geom: AttnGeometry) -> torch.Tensor:
    """Sum the o_proj column scores over each KV group's query heads: (n_kv,)."""
    return col_scores.view(geom.n_kv, geom.groups * geom.head_dim).sum(1)


def select_layer(method: str, o_weight: torch.Tensor, o_stats: dict, down_weight: torch.Tensor,
                 down_stats: dict, geom: AttnGeometry, ratio: float,
                 group_rounding: str = "ceil", channel_rounding: str = "ceil") -> dict:
    """Keep sets of one layer: ``kv_groups`` and ``channels`` (ascending index lists)."""
    o_scores = column_scores(method, o_weight, channel_sumsq(o_stats), o_stats["sum"], o_stats["count"])
    d_scores = column_scores(method, down_weight, channel_sumsq(down_stats), down_stats["sum"],
                             down_stats["count"])
    g_scores = group_scores(o_scores, geom)
    return {
        "kv_groups": top_k_sorted(g_scores, n_keep(geom.n_kv, ratio, group_rounding)),
        "channels": top_k_sorted(d_scores, n_keep(d_scores.numel(), ratio, channel_rounding)),
    }


def head_indices(kv_groups: list[int], geom: AttnGeometry) -> list[int]:
    """Query heads of the kept KV groups (head h belongs to KV head h // groups)."""
    return [g * geom.groups + j for g in kv_groups for j in range(geom.groups)]


def o_proj_columns(kv_groups: list[int], geom: AttnGeometry) -> torch.Tensor:
    """Input columns of o_proj kept with ``kv_groups`` (ascending), LongTensor."""
    heads = torch.tensor(head_indices(kv_groups, geom), dtype=torch.long)
    return (heads[:, None] * geom.head_dim + torch.arange(geom.head_dim)).reshape(-1)


def kv_rows(kv_groups: list[int], geom: AttnGeometry) -> torch.Tensor:
    """Output rows of k_proj / v_proj kept with ``kv_groups`` (ascending), LongTensor."""
    g = torch.tensor(kv_groups, dtype=torch.long)
    return (g[:, None] * geom.head_dim + torch.arange(geom.head_dim)).reshape(-1)
