"""obs: the selection with the compensation in the loop, structured Optimal Brain Surgeon as in
ZipLM and SlimGPT (docs/obs.md).

Per layer and module, with W (d_out, d_in) the original weight and G the calibration Gram of its
input, whole units of input columns (a KV group's query heads' o_proj columns as one block; one
down_proj column per MLP channel) are removed greedily, each step removing the unit whose removal,
with the optimal update of every column that stays, raises the error least. With
H = G + λI, λ = ``damp`` · mean(diag G), and V the current fit of the columns that stay (R),
removing a set S of them raises the objective by

    ΔE(S) = tr(V_S [(H⁻¹)_SS]⁻¹ V_Sᵀ),  V ← V − V_S [(H⁻¹)_SS]⁻¹ (H⁻¹)_{S,:},
    H⁻¹ ← H⁻¹ − (H⁻¹)_{:,S} [(H⁻¹)_SS]⁻¹ (H⁻¹)_{S,:}            (Schur complement: H_RR⁻¹)

where H⁻¹ is the inverse of H over R (the removed rows and columns are zero). The greedy starts
from V = W G H⁻¹ = W − λ W H⁻¹, the ridge fit of every column; then V over R is, after every step,
``lstsq``'s ridge refit ``W G_{:,R} (G_RR + λI)⁻¹`` and the objective is its ridge objective
||W X − V X_R||² + λ||V||² (at ``damp`` 0 the least-squares error itself). What the greedy
predicts is the reconstruction error of that refit relative to the output energy,
``relerr = tr((W − V) G (W − V)ᵀ) / tr(W G Wᵀ)``: ``lstsq`` with the same λ reproduces it (its
``relerr_after``; its ``ridge`` is relative to the kept columns' mean diagonal, so the same λ is
``ridge = damp · mean(diag G) / mean(diag G_RR)``).

A step removes one KV group (a layer has few), or the ``batch`` MLP channels of the smallest
ΔE({j}) = ||V_j||² / (H⁻¹)_jj together (SlimGPT's batches; the increase recorded is the joint
one). The kept counts are ``KeepRule``'s (``n_keep`` KV groups, ``aligned_keep`` channels).
Removing an MLP channel also drops its gate/up rows, which need no update. Everything is float64
on the weight's device; one step costs O(d_in² · s) for s columns removed.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from coec.model.arch import AttnShape

if TYPE_CHECKING:
    import torch

from coec.select.scores import SCORES, KeepRule, ModuleStats, Score, ScoreSpec, aligned_keep, n_keep

#: the options of obs (their defaults: the config schema's ``selections.*.<option>``)
OPTIONS = ("damp", "batch")


@dataclass(frozen=True)
class ObsResult:
    """One module's greedy: ``keep`` the kept units (ascending), ``removed`` the pruned ones in
    the order removed, ``weight`` (d_out, d_in) float64 the refit of the kept columns in place
    (zeros at the pruned ones), ``increases`` the objective's increase at each step, ``relerr``
    the predicted error ||(W − V) X||² / ||W X||² (0 for a zero output energy)."""

    keep: list[int]
    removed: list[int]
    weight: torch.Tensor
    increases: list[float]
    relerr: float


def damped_inverse(G: torch.Tensor, damp: float) -> tuple[torch.Tensor, float]:
    """(H⁻¹, λ) of H = G + λI, λ = ``damp`` · mean(diag G), from G (d, d) float64 symmetric, by
    Cholesky (factored in H's storage: two (d, d) matrices beside G at the peak). ValueError when
    H is not positive definite (``damp`` 0 on a singular Gram)."""
    import torch  # deferred: the selection is registered, and the config checked, without torch

    lam = damp * float(G.diagonal().mean())
    H = G.clone()
    H.diagonal().add_(lam)
    info = torch.empty((), dtype=torch.int32, device=H.device)
    if int(torch.linalg.cholesky_ex(H, out=(H, info)).info) != 0:  # H becomes its factor L
        raise ValueError(
            f"obs: the damped Gram G + {lam:.3g} I is not positive definite (damp {damp}); raise the damp option"
        )
    return torch.cholesky_inverse(H), lam


def downdate(Hinv: torch.Tensor, V: torch.Tensor, cols: torch.Tensor) -> float:
    """Remove the input columns ``cols`` (s,) in place: V (d_out, d) takes the optimal update of
    the columns that stay, H⁻¹ (d, d) becomes the inverse over them (the Schur complement), both
    zero at ``cols``. Returns the objective's increase tr(V_S [(H⁻¹)_SS]⁻¹ V_Sᵀ)."""
    import torch  # deferred: the selection is registered, and the config checked, without torch

    rows = Hinv[cols]  # (H⁻¹)_{S,:}
    M = rows[:, cols]
    L, info = torch.linalg.cholesky_ex(M)
    VS = V[:, cols]
    if int(info) == 0:
        K = torch.cholesky_solve(rows, L)  # [(H⁻¹)_SS]⁻¹ (H⁻¹)_{S,:}
        Z = torch.cholesky_solve(VS.mT, L)
    else:  # rounding left the block singular: its pseudo-inverse
        Mp = torch.linalg.pinv(M, hermitian=True)
        K, Z = Mp @ rows, Mp @ VS.mT
    increase = float((VS.mT * Z).sum())
    V.addmm_(VS, K, alpha=-1.0)
    Hinv.addmm_(rows.mT, K, alpha=-1.0)
    V[:, cols] = 0.0
    Hinv[cols] = 0.0
    Hinv[:, cols] = 0.0
    return increase


def unit_costs(Hinv: torch.Tensor, V: torch.Tensor, alive: torch.Tensor, block: int) -> torch.Tensor:
    """ΔE of removing each unit (``block`` consecutive input columns) alone, (n_units,) float64;
    inf for the units already removed (``alive`` False)."""
    import torch  # deferred: the selection is registered, and the config checked, without torch

    if block == 1:
        cost = (V * V).sum(0) / Hinv.diagonal().clamp_min(torch.finfo(torch.float64).tiny)
        return cost.masked_fill_(~alive, math.inf)
    cost = torch.full(alive.shape, math.inf, dtype=torch.float64, device=V.device)
    units = alive.nonzero().squeeze(1)
    idx = units[:, None] * block + torch.arange(block, device=V.device)  # (n, b) columns of each unit
    B = Hinv[idx[:, :, None], idx[:, None, :]]  # (n, b, b): each unit's diagonal block of H⁻¹
    Vb = V[:, idx].permute(1, 2, 0)  # (n, b, d_out)
    L, info = torch.linalg.cholesky_ex(B)
    Y = torch.linalg.solve_triangular(L, Vb, upper=False)
    c = (Y**2).sum((1, 2))
    cost[units] = torch.where(info == 0, c, torch.full_like(c, math.inf))
    return cost


def obs_prune(
    W: torch.Tensor, G: torch.Tensor, keep: int, block: int = 1, damp: float = 0.01, batch: int = 1
) -> ObsResult:
    """The greedy (module docstring) on W (d_out, d_in) and its input's Gram G (d_in, d_in): the
    d_in / ``block`` units of ``block`` consecutive columns pruned down to ``keep``, ``batch``
    units a step. Runs on W's device in float64."""
    import torch  # deferred: the selection is registered, and the config checked, without torch

    d_out, d_in = W.shape
    if block < 1 or d_in % block:
        raise ValueError(f"obs: {d_in} input columns do not split into units of {block}")
    n_units = d_in // block
    if not 1 <= keep <= n_units:
        raise ValueError(f"obs: cannot keep {keep} of {n_units} units")
    if batch < 1:
        raise ValueError(f"obs: batch must be at least 1, got {batch}")
    W64 = W.to(torch.float64)
    G64 = G.to(W.device, torch.float64)
    G64 = (G64 + G64.mT) / 2
    Hinv, lam = damped_inverse(G64, damp)
    V = W64 - lam * (W64 @ Hinv)  # W G H⁻¹: the ridge fit of every column
    alive = torch.ones(n_units, dtype=torch.bool, device=W.device)
    removed: list[int] = []
    increases: list[float] = []
    offsets = torch.arange(block, device=W.device)
    while len(removed) < n_units - keep:
        take = min(batch, n_units - keep - len(removed))
        units = torch.sort(unit_costs(Hinv, V, alive, block), stable=True).indices[:take]
        increases.append(downdate(Hinv, V, (units[:, None] * block + offsets).reshape(-1)))
        alive[units] = False
        removed.extend(units.tolist())
    R = W64 - V
    energy = float(((W64 @ G64) * W64).sum())
    err = float(((R @ G64) * R).sum())
    relerr = err / energy if energy > 0 else 0.0
    return ObsResult(alive.nonzero().squeeze(1).tolist(), removed, V, increases, relerr)


def select_obs(
    weights: Mapping[str, torch.Tensor],
    stats: Mapping[str, ModuleStats],
    geom: AttnShape,
    rule: KeepRule,
    spec: ScoreSpec,
) -> dict[str, Any]:
    """Keep sets of one layer by the greedy: ``kv_groups`` (o_proj's blocks of a group's query
    heads, one a step), ``channels`` (down_proj's columns, ``batch`` a step), as many as ``rule``
    keeps, and ``predicted_relerr`` of each module (``ObsResult.relerr``)."""
    o = dict(spec.own)
    damp, batch = float(o["damp"]), int(o["batch"])
    attn = obs_prune(
        weights["o_proj"],
        stats["o_proj"]["gram"],
        n_keep(geom.n_kv, rule.ratio, rule.group_rounding),
        block=geom.groups * geom.head_dim,
        damp=damp,
    )
    down = weights["down_proj"]
    n_channels = aligned_keep(down.shape[1], rule.ratio, rule.channel_multiple, rule.channel_rounding)
    mlp = obs_prune(down, stats["down_proj"]["gram"], n_channels, damp=damp, batch=batch)
    return {
        "kv_groups": attn.keep,
        "channels": mlp.keep,
        "predicted_relerr": {"o_proj": attn.relerr, "down_proj": mlp.relerr},
    }


def resolve_options(given: Mapping[str, Any], where: str) -> dict[str, Any]:
    """obs's options checked, the missing ones the config schema's defaults: ``damp`` a number
    ≥ 0, ``batch`` an integer ≥ 1. ValueError naming ``where`` otherwise."""
    from coec.config.validate import schema_default  # deferred: the schema is read only here

    for key in given:
        if key not in OPTIONS:
            raise ValueError(f"{where}: unknown option {key!r}; obs takes {', '.join(OPTIONS)}")
    out = {k: given[k] if k in given else schema_default(f"selections.*.{k}") for k in OPTIONS}
    damp, batch = out["damp"], out["batch"]
    if isinstance(damp, bool) or not isinstance(damp, (int, float)) or not math.isfinite(damp) or damp < 0:
        raise ValueError(f"{where}.damp: {damp!r} is not a number >= 0")
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise ValueError(f"{where}.batch: {batch!r} is not an integer >= 1")
    return {"damp": float(damp), "batch": batch}


def _no_columns(weight: torch.Tensor, stats: Any, spec: ScoreSpec) -> torch.Tensor:
    raise ValueError("obs selects in the loop (coec.select.obs): it has no column scores")


SCORE = SCORES.register(
    Score(
        "obs",
        _no_columns,
        "greedy structured OBS: the unit whose removal, with the ridge refit of the rest, raises "
        "||(W - W') X||^2 least (ZipLM, SlimGPT)",
        uses_activation_scale=False,
        select=select_obs,
        resolve_options=resolve_options,
    )
)
