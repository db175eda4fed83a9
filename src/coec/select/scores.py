"""Column scores and keep sets (docs/protocol.md "Selection").

Scores of input column j of o_proj / down_proj with W the original weight (d_out, d_in) and
X_j the calibration activations of channel j:

    wanda_sp   ||W[:, j]|| · ||X_j||
    flap       Var(X_j) · ||W[:, j]||²                  (FLAP's WIFV)
    rcpu       ||W[:, j]|| · ||X_j|| · Var(X_j)

||X_j|| = sqrt(G_jj); Var is the unbiased token variance from Σx² (the Gram's diagonal, stored in
float64 beside the Gram: ``sumsq``), the channel sum and the token count. Attention prunes whole
KV groups with their query heads (a group's score is the sum of its o_proj columns' scores); the
MLP prunes single channels, the top ``aligned_keep`` of them: with ``channel_multiple`` > 1 a
multiple of it (``coec.select.widths``; quantizer blocks).

Variants (a ``selections`` entry of the config; docs/selection-variants.md). Each option's first
value is the paper's formula above, so the three paper selections are the variants with no options:

    weight_norm        l2 ||W[:, j]||          | l1_mean: mean_i |W_ij| (FLAP's Wanda-sp code)
    activation_scale   l2 ||X_j|| = sqrt(Σx²)  | abs_mean: E|x_j| = Σ|x| / n (RCPU's code; needs
                       Grams holding ``abssum``; flap has no such factor)
    group_aggregation  sum: Σ_j s_j            | sum_squared: Σ_j s_j² (FLAP's code squares WIFV)

A score with a layer selection of its own (``Score.select``; ``obs``, ``coec.select.obs``) picks
the keep sets itself from the weights and the whole Grams, with options of its own
(``Score.resolve_options``; ``ScoreSpec.own``) in place of the variant options above.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from coec.model.arch import AttnShape
from coec.registry import Registry
from coec.select.rounding import DEFAULT_ROUNDING
from coec.select.search import SEARCH, is_search
from coec.select.widths import WIDTH_KEYS

if TYPE_CHECKING:
    import torch

ROUNDINGS = ("ceil", "nearest")
#: roundings of a kept MLP channel count (config ``channel_rounding``; KV groups: ``ROUNDINGS``)
CHANNEL_ROUNDINGS = (*ROUNDINGS, "floor")
#: option -> allowed values; the first is the paper's formula (the default)
SCORE_OPTIONS = {
    "weight_norm": ("l2", "l1_mean"),
    "activation_scale": ("l2", "abs_mean"),
    "group_aggregation": ("sum", "sum_squared"),
}


@dataclass(frozen=True)
class ScoreSpec:
    """A selection score: the paper's formula ``score`` with its variant options."""

    score: str
    weight_norm: str = "l2"
    activation_scale: str = "l2"
    group_aggregation: str = "sum"
    #: a score's own options (``Score.resolve_options``), resolved: sorted (name, value) pairs
    own: tuple[tuple[str, Any], ...] = ()

    def options(self) -> dict[str, Any]:
        """The options that differ from the paper's formula (empty for the paper's selections),
        then the score's own options, every one (``own``)."""
        out = {k: v for k, v in asdict(self).items() if k in SCORE_OPTIONS and v != SCORE_OPTIONS[k][0]}
        return {**out, **dict(self.own)}


#: A selection as a config names it: a paper name (``"rcpu"``), a mapping ``{score: ..., <option>:
#: ...}`` or a :class:`ScoreSpec`.
Selection = str | Mapping[str, Any] | ScoreSpec

#: One module's calibration statistics (``artifacts.read_gram_layer``): ``gram`` or ``sumsq``,
#: ``sum``, ``count``, optionally ``abssum``.
ModuleStats = Mapping[str, Any]


@dataclass(frozen=True)
class KeepRule:
    """How much of a layer survives: the pruning ``ratio``, the rounding of the kept KV groups
    (``group_rounding``: ``ROUNDINGS``) and of the kept MLP channels (``channel_rounding`` to a
    multiple of ``channel_multiple``: ``aligned_keep``). The defaults are the paper's rule."""

    ratio: float
    group_rounding: str = DEFAULT_ROUNDING
    channel_rounding: str = DEFAULT_ROUNDING
    channel_multiple: int = 1


@dataclass(frozen=True)
class ColumnStats:
    """What a score may read of one module's calibration input: ``sumsq`` Σx² (d,), ``total`` Σx
    (d,), ``count`` tokens and ``abssum`` Σ|x| (d,) or None (Grams written before it was stored)."""

    sumsq: torch.Tensor
    total: torch.Tensor
    count: int
    abssum: torch.Tensor | None = None

    def variance(self) -> torch.Tensor:
        """Unbiased per-channel variance (d,) float64."""
        return channel_variance(self.sumsq, self.total, self.count)

    def scale(self, kind: str = "l2") -> torch.Tensor:
        """||X_j|| (``l2``) or E|x_j| (``abs_mean``), (d,) float64."""
        return activation_scale(self.sumsq, self.count, kind, self.abssum)


#: A score's own selection of one layer (``Score.select``): (weights, stats, geom, rule, spec) ->
#: keep sets, as ``select_layer`` returns them.
LayerSelect = Callable[
    [Mapping[str, "torch.Tensor"], Mapping[str, "ModuleStats"], AttnShape, "KeepRule", "ScoreSpec"], dict[str, Any]
]


@dataclass(frozen=True)
class Score:
    """A registered selection score. ``columns(weight, stats, spec)`` gives the importance of every
    input column of ``weight`` (d_out, d_in) as (d_in,) float64 from its ``ColumnStats``, honouring
    the variant options of ``spec`` (a ``ScoreSpec``: ``weight_norm``, ``activation_scale``);
    ``uses_activation_scale`` False refuses an ``activation_scale`` variant (the score has no
    ||X_j|| factor). Every registered score is also a selection of its own name.

    ``select``: a selection that picks a layer's keep sets itself, ``select(weights, stats, geom,
    rule, spec)``, from the weights and the whole Grams (``stats[module]["gram"]``; ``needs_gram``)
    instead of the top of ``columns``; it refuses the variant options and may add fields to the
    layer's keep sets (obs: ``predicted_relerr``). ``resolve_options(given, where)``: the score's
    own options, checked and completed (defaults filled), as ``ScoreSpec.own`` holds them."""

    name: str
    columns: Callable[[torch.Tensor, ColumnStats, ScoreSpec], torch.Tensor]
    doc: str
    uses_activation_scale: bool = True
    select: LayerSelect | None = None
    resolve_options: Callable[[Mapping[str, Any], str], dict[str, Any]] | None = None

    @property
    def needs_gram(self) -> bool:
        """The score reads the whole Gram of each module (a selection of its own, ``select``)."""
        return self.select is not None


#: Every selection score, by name (the paper's three below; plug-ins: config ``plugins``).
SCORES: Registry[Score] = Registry("selection score")


def _wanda_sp(weight: torch.Tensor, stats: ColumnStats, spec: ScoreSpec) -> torch.Tensor:
    return weight_column_norm(weight, spec.weight_norm) * stats.scale(spec.activation_scale)


def _flap(weight: torch.Tensor, stats: ColumnStats, spec: ScoreSpec) -> torch.Tensor:
    return stats.variance() * weight_column_norm(weight, spec.weight_norm) ** 2


def _rcpu(weight: torch.Tensor, stats: ColumnStats, spec: ScoreSpec) -> torch.Tensor:
    w_norm = weight_column_norm(weight, spec.weight_norm)
    return w_norm * stats.scale(spec.activation_scale) * stats.variance()


SCORES.register(Score("wanda_sp", _wanda_sp, "||W[:, j]|| ||X_j|| (Wanda-sp)"))
SCORES.register(Score("flap", _flap, "Var(X_j) ||W[:, j]||^2 (FLAP's WIFV)", uses_activation_scale=False))
SCORES.register(Score("rcpu", _rcpu, "||W[:, j]|| ||X_j|| Var(X_j) (RCPU)"))
SCORES.register_lazy("obs", "coec.select.obs")  # greedy structured OBS (coec.select.obs), imported on first lookup


def selection_spec(spec: Selection, where: str = "selection") -> ScoreSpec:
    """A :class:`ScoreSpec` from a paper name (``"rcpu"``), a mapping ``{score: ..., <option>: ...}``
    or a ScoreSpec; raises ValueError naming ``where`` for an unknown score, option or value."""
    if isinstance(spec, ScoreSpec):
        spec = {"score": spec.score, **spec.options()}
    if isinstance(spec, str):
        spec = {"score": spec}
    spec = dict(spec)
    score = spec.pop("score", None)
    if score not in SCORES:
        raise ValueError(f"{where}.score: {SCORES.unknown(score)}")
    entry = SCORES[score]
    if entry.resolve_options is not None or entry.needs_gram:
        return _own_spec(entry, spec, where)
    for key, val in spec.items():
        if key not in SCORE_OPTIONS:
            raise ValueError(f"{where}: unknown option {key!r}; expected {', '.join(SCORE_OPTIONS)}")
        if val not in SCORE_OPTIONS[key]:
            raise ValueError(f"{where}.{key}: {val!r} is not one of {', '.join(SCORE_OPTIONS[key])}")
    if not SCORES[score].uses_activation_scale and spec.get("activation_scale", "l2") != "l2":
        raise ValueError(f"{where}.activation_scale: the {score} score has no ||X_j|| factor")
    return ScoreSpec(score, **spec)


def _own_spec(entry: Score, spec: dict[str, Any], where: str) -> ScoreSpec:
    """The spec of a score with a selection or options of its own: no variant option, its own
    options resolved (``Score.resolve_options``)."""
    if entry.needs_gram and (variant := [k for k in spec if k in SCORE_OPTIONS]):
        raise ValueError(f"{where}.{variant[0]}: the {entry.name} selection ranks no column scores; no variant options")
    if entry.resolve_options is None:
        if spec:
            raise ValueError(f"{where}: unknown option {next(iter(spec))!r}; the {entry.name} selection has none")
        return ScoreSpec(entry.name)
    return ScoreSpec(entry.name, own=tuple(sorted(entry.resolve_options(spec, where).items())))


def selection_registry(selections: Mapping[str, Any] | None = None) -> dict[str, ScoreSpec]:
    """Selection name -> :class:`ScoreSpec`: every registered score under its own name (the
    paper's ``wanda_sp``, ``flap``, ``rcpu`` and plug-ins', fixed, so their result paths keep their
    meaning) plus a config's ``selections`` entries (their ``channel_multiple`` /
    ``channel_rounding`` are the width's, ``coec.select.widths.selection_width``). A width search
    (``score: search``, ``coec.select.search``) is ``ScoreSpec("search")``: its entry is
    checked and read by the search itself."""
    out = {name: selection_spec(name) for name in SCORES}
    for name, spec in (selections or {}).items():
        if is_search(spec) and name not in SCORES:  # a registered name falls through to its refusal
            out[name] = ScoreSpec(SEARCH)
            continue
        score = spec if isinstance(spec, (str, ScoreSpec)) else {k: v for k, v in spec.items() if k not in WIDTH_KEYS}
        s = selection_spec(score, f"selections.{name}")
        if name in SCORES and (s != out[name] or score != spec):
            raise ValueError(
                f"selections.{name}: the registered score {name!r} cannot be redefined "
                f"(its results keep their paths); give the variant another name"
            )
        out[name] = s
    return out


def channel_variance(gram_diag: torch.Tensor, total: torch.Tensor, count: int) -> torch.Tensor:
    """Unbiased per-channel variance from Σx², Σx and the token count, (d,)."""
    g = gram_diag.double()
    mean = total.double() / count
    return ((g - count * mean**2) / max(count - 1, 1)).clamp_min(0.0)


def weight_column_norm(weight: torch.Tensor, kind: str = "l2") -> torch.Tensor:
    """Per input column of ``weight`` (d_out, d_in): ||W[:, j]|| (l2) or mean_i |W_ij| (l1_mean)."""
    w = weight.double()
    return w.norm(dim=0) if kind == "l2" else w.abs().mean(dim=0)


def activation_scale(
    gram_diag: torch.Tensor, count: int, kind: str = "l2", abssum: torch.Tensor | None = None
) -> torch.Tensor:
    """Per channel: ||X_j|| = sqrt(Σx²) (l2) or E|x_j| = Σ|x| / n (abs_mean, needs ``abssum``)."""
    if kind == "l2":
        return gram_diag.double().clamp_min(0.0).sqrt()
    if abssum is None:
        raise ValueError(
            "activation_scale abs_mean needs Σ|x| per channel (the Grams' `abssum`): "
            "these Grams predate it; recalibrate (delete the grams folder and rerun)"
        )
    return abssum.double() / count


def column_scores(
    method: Selection,
    weight: torch.Tensor,
    gram_diag: torch.Tensor,
    total: torch.Tensor,
    count: int,
    abssum: torch.Tensor | None = None,
) -> torch.Tensor:
    """Importance of every input column of ``weight`` (d_out, d_in) -> (d_in,) float64.
    ``method``: a paper name or a variant (``selection_spec``); ``abssum`` (Σ|x|) only for
    ``activation_scale: abs_mean``."""
    if isinstance(method, str) and method not in SCORES:
        raise ValueError(SCORES.unknown(method))
    spec = selection_spec(method)
    return SCORES[spec.score].columns(weight, ColumnStats(gram_diag, total, count, abssum), spec)


def n_keep(n: int, ratio: float, rounding: str = DEFAULT_ROUNDING) -> int:
    """How many of ``n`` units survive pruning ratio ``ratio``.

    ceil: keep ceil((1-ratio)·n) (the paper's rule); nearest: prune round(ratio·n) (half up),
    so 3 KV groups at 30 % lose one; floor: keep floor((1-ratio)·n). At least one unit is
    always kept.
    """
    check_ratio(ratio)
    if rounding == "ceil":
        k = math.ceil((1.0 - ratio) * n - 1e-9)
    elif rounding == "nearest":
        k = n - math.floor(ratio * n + 0.5 + 1e-9)
    elif rounding == "floor":
        k = math.floor((1.0 - ratio) * n + 1e-9)
    else:
        raise ValueError(f"unknown rounding {rounding!r}; expected one of {', '.join(CHANNEL_ROUNDINGS)}")
    return max(1, min(n, k))


def check_multiple(n: int, multiple: int) -> None:
    """``channel_multiple`` against a layer's MLP width ``n``: a positive integer, at most ``n``."""
    if isinstance(multiple, bool) or not isinstance(multiple, int) or multiple < 1:
        raise ValueError(f"channel_multiple must be a positive integer, got {multiple!r}")
    if multiple > n:
        raise ValueError(f"channel_multiple {multiple} is larger than the MLP width d_ff = {n}")


def aligned_steps(n: int, ratio: float, multiple: int, rounding: str) -> int:
    """How many ``multiple``-channel steps the kept count (1-ratio)·n rounds to: ceil, floor or
    nearest (a tie keeps fewer, as ``n_keep``'s nearest prunes half up); may be 0."""
    check_ratio(ratio)
    check_multiple(n, multiple)
    q = (1.0 - ratio) * n / multiple
    if rounding == "ceil":
        return math.ceil(q - 1e-9)
    if rounding == "nearest":
        return math.ceil(q - 0.5 - 1e-9)
    if rounding == "floor":
        return math.floor(q + 1e-9)
    raise ValueError(f"unknown channel_rounding {rounding!r}; expected one of {', '.join(CHANNEL_ROUNDINGS)}")


def aligned_keep(n: int, ratio: float, multiple: int = 1, rounding: str = DEFAULT_ROUNDING) -> int:
    """MLP channels kept of ``n`` at ``ratio``: a multiple of ``multiple`` (docs/selection-variants.md
    "Aligned widths"). Multiple 1 is ``n_keep`` exactly; otherwise ``aligned_steps`` multiples, at
    least one (a rounding to 0 keeps one multiple) and at most ``n`` (a rounding past the width
    keeps every channel: the dense width)."""
    if multiple == 1:
        return n_keep(n, ratio, rounding)
    return min(n, multiple * max(1, aligned_steps(n, ratio, multiple, rounding)))


def check_ratio(ratio: float) -> None:
    if not (0.0 < float(ratio) < 1.0):
        raise ValueError(f"pruning ratio must lie in (0, 1), got {ratio}")


def top_k_sorted(scores: torch.Tensor, k: int) -> list[int]:
    """Indices of the k highest scores (ties broken by lower index), returned ascending."""
    import torch  # deferred: keeps the job boundary torch-free

    order = torch.sort(-scores, stable=True).indices[:k]
    return sorted(order.tolist())


def group_scores(col_scores: torch.Tensor, geom: AttnShape, aggregation: str = "sum") -> torch.Tensor:
    """Sum the o_proj column scores (``sum``) or their squares (``sum_squared``) over each KV
    group's query heads: (n_kv,)."""
    if aggregation not in SCORE_OPTIONS["group_aggregation"]:
        raise ValueError(
            f"unknown group_aggregation {aggregation!r}; expected one of "
            f"{', '.join(SCORE_OPTIONS['group_aggregation'])}"
        )
    s = col_scores if aggregation == "sum" else col_scores**2
    return s.view(geom.n_kv, geom.groups * geom.head_dim).sum(1)


def layer_scores(
    method: Selection, weights: Mapping[str, torch.Tensor], stats: Mapping[str, ModuleStats], geom: AttnShape
) -> dict[str, torch.Tensor]:
    """``o_proj`` and ``down_proj`` column scores and the KV ``groups`` scores of one layer, from
    each module's original weight (d_out, d_in) and calibration statistics (keyed by module)."""
    spec = selection_spec(method)
    o_scores = _module_scores(spec, weights["o_proj"], stats["o_proj"])
    d_scores = _module_scores(spec, weights["down_proj"], stats["down_proj"])
    return {"o_proj": o_scores, "down_proj": d_scores, "groups": group_scores(o_scores, geom, spec.group_aggregation)}


def _module_scores(spec: ScoreSpec, weight: torch.Tensor, st: ModuleStats) -> torch.Tensor:
    from coec.calibrate.layer_pass import channel_sumsq  # deferred: keeps the job boundary torch-free

    return column_scores(spec, weight, channel_sumsq(st), st["sum"], st["count"], st.get("abssum"))


def select_layer(
    method: Selection,
    weights: Mapping[str, torch.Tensor],
    stats: Mapping[str, ModuleStats],
    geom: AttnShape,
    rule: KeepRule,
) -> dict[str, Any]:
    """Keep sets of one layer: ``kv_groups`` and ``channels`` (ascending index lists): the top of
    the scores (``layer_scores``), as many as ``rule`` keeps (``n_keep`` KV groups,
    ``aligned_keep`` channels). ``method``: a paper name or a variant (``selection_spec``). A
    score with a selection of its own (``Score.select``) picks them itself, as many."""
    spec = selection_spec(method)
    if (own := SCORES[spec.score].select) is not None:
        return own(weights, stats, geom, rule, spec)
    sc = layer_scores(spec, weights, stats, geom)
    d_scores, g_scores = sc["down_proj"], sc["groups"]
    n_channels = aligned_keep(d_scores.numel(), rule.ratio, rule.channel_multiple, rule.channel_rounding)
    return {
        "kv_groups": top_k_sorted(g_scores, n_keep(geom.n_kv, rule.ratio, rule.group_rounding)),
        "channels": top_k_sorted(d_scores, n_channels),
    }
