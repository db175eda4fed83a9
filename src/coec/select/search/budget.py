"""Per-layer width levels and the budget a search allocates them under (EvoPress, arXiv
2410.14649; DarwinLM and Týr-the-Pruner search widths the same way): the search's space.

Units. Every layer has two, attention first: ``kv_groups`` (kept KV groups, each with its query
heads; levels 1..n_kv) and ``channels`` (kept MLP channels; levels the multiples of
``channel_multiple`` up to d_ff, and d_ff itself). ``allow_removal`` adds the level 0 (the block
removed), which only some exports serve.

Costs. What a unit keeps at a level, in one of two measures:

* ``params``: prunable parameters, those that scale with the kept units: the q/k/v rows and o_proj
  columns of the kept groups with their q/k/v biases (2 hd (g + 1) d a group, biases aside), the
  gate/up rows and down_proj columns of the kept channels with their gate/up biases (3 d a channel);
  the o_proj / down_proj biases, q/k norms, RMSNorms and embeddings are outside the budget;
* ``bytes``: the bytes of the block's tensors in a GGUF type (``coec.export.gguf.mix``: each
  tensor's fallback for its row width, the K-quant mixes' Q6_K blocks; 1-D tensors f32), less those
  of the block at level 0 (its norms and fixed biases), which count in ``SearchSpace.fixed``.

Budget (config ``search.budget``):

* none: the prunable parameters of the uniform cell at the ratio, rounded as the uniform selection
  rounds (``n_keep`` with ``group_rounding``, ``aligned_keep`` with ``channel_multiple`` /
  ``channel_rounding``): the uniform allocation meets it exactly;
* ``{params: N}``: N prunable parameters;
* ``{bytes: N, type: T}``: N bytes of tensor data of the whole GGUF file of type T; the embeddings,
  head, norms and fixed biases (``SearchSpace.fixed``) are counted first, the units share the rest.
  The K-quant mixes choose the types of attn_v / ffn_down by block position, and the cost table
  takes every block as present: with removed blocks (level 0) ``model_bytes`` is the exact count.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from itertools import accumulate
from typing import Any

from coec.export.gguf.mix import SEVENTY_B_BLOCKS, Place, check_mix_type, tensor_bytes, use_more_bits
from coec.model.arch import adapter_for
from coec.report.cost import arch_dims, config_dict
from coec.select.scores import KeepRule, aligned_keep, check_multiple, n_keep
from coec.select.search import budget_key

#: the two units of a layer, in order: attention (KV groups) and MLP (channels)
KINDS = ("kv_groups", "channels")
#: the measures a budget is counted in
MEASURES = ("params", "bytes")
F32_BYTES = 4
RATIO_EPS = 1e-7  # ratios this far either side of a rounding's breakpoint: clear of its 1e-9 fudge


@dataclass(frozen=True)
class Unit:
    """One layer's attention or MLP: its ``levels`` (kept counts, ascending) and their ``costs``."""

    layer: int
    kind: str
    levels: tuple[int, ...]
    costs: tuple[int, ...]

    def __post_init__(self) -> None:
        where = f"layer {self.layer} {self.kind}"
        if not self.levels or len(self.levels) != len(self.costs):
            raise ValueError(f"{where}: {len(self.levels)} levels but {len(self.costs)} costs")
        if self.levels[0] < 0 or any(b <= a for a, b in zip(self.levels, self.levels[1:])):
            raise ValueError(f"{where}: levels must be distinct, ascending and >= 0, got {self.levels}")

    @cached_property
    def floor(self) -> tuple[int, ...]:
        """The cheapest cost of the levels up to each: ``min(costs[: i + 1])``."""
        return tuple(accumulate(self.costs, min))


@dataclass(frozen=True)
class SearchSpace:
    """Units (layer by layer, attention first), the ``budget`` their costs share (in ``measure``),
    the ``uniform`` allocation (level indices: one width in every layer, within the budget) and
    the cost outside the units (``fixed``: bytes of embeddings, head, norms; 0 for params).

    A state is a tuple of level indices, one per unit; ``values`` turns it into kept counts."""

    units: tuple[Unit, ...]
    budget: int
    uniform: tuple[int, ...]
    measure: str = "params"
    fixed: int = 0

    def __post_init__(self) -> None:
        if self.measure not in MEASURES:
            raise ValueError(f"measure {self.measure!r}: expected one of {', '.join(MEASURES)}")
        self.check(self.uniform)

    def check(self, state: Sequence[int]) -> None:
        """ValueError unless ``state`` holds one valid level index per unit."""
        if len(state) != len(self.units) or any(not 0 <= i < len(u.levels) for u, i in zip(self.units, state)):
            raise ValueError(f"a state needs one level index per unit ({len(self.units)}), got {tuple(state)}")

    def cost(self, state: Sequence[int]) -> int:
        return sum(u.costs[i] for u, i in zip(self.units, state, strict=True))

    def lowest(self) -> int:
        """The cost of the cheapest allocation."""
        return sum(min(u.costs) for u in self.units)

    def highest(self) -> int:
        """The cost of the dearest allocation (the dense model when costs grow with the level)."""
        return sum(max(u.costs) for u in self.units)

    def values(self, state: Sequence[int]) -> tuple[int, ...]:
        """Kept counts per unit (the order of ``units``)."""
        return tuple(u.levels[i] for u, i in zip(self.units, state, strict=True))

    def state_of(self, values: Sequence[int]) -> tuple[int, ...]:
        """Level indices of kept counts; ValueError naming the unit for a count that is no level."""
        if len(values) != len(self.units):
            raise ValueError(f"expected {len(self.units)} kept counts, got {len(values)}")
        out = []
        for u, v in zip(self.units, values):
            if v not in u.levels:
                key = "channel_multiple: " if u.kind == "channels" else ""
                raise ValueError(f"{key}layer {u.layer} {u.kind}: {v} is not one of its levels {level_span(u.levels)}")
            out.append(u.levels.index(v))
        return tuple(out)

    def widths(self, state: Sequence[int]) -> list[dict[str, int]]:
        """Per layer: ``{"kv_groups": k, "channels": c}`` (keep.json's keys, as counts)."""
        out: dict[int, dict[str, int]] = {}
        for u, v in zip(self.units, self.values(state)):
            out.setdefault(u.layer, {})[u.kind] = v
        return [out[i] for i in sorted(out)]


def level_span(levels: Sequence[int]) -> str:
    if len(levels) <= 6:
        return ", ".join(map(str, levels))
    return f"{levels[0]}, {levels[1]}, ..., {levels[-1]}"


# ----------------------------------------------------------------------------- levels
def kv_levels(n_kv: int, allow_removal: bool = False) -> tuple[int, ...]:
    """Kept KV groups a layer may have: 1..n_kv (0..n_kv with ``allow_removal``)."""
    return tuple(range(0 if allow_removal else 1, n_kv + 1))


def channel_levels(d_ff: int, multiple: int, allow_removal: bool = False) -> tuple[int, ...]:
    """Kept MLP channels a layer may have: the multiples of ``multiple`` up to ``d_ff``, and
    ``d_ff`` (the dense width, as ``aligned_keep`` keeps it); 0 first with ``allow_removal``."""
    check_multiple(d_ff, multiple)
    levels = list(range(multiple, d_ff + 1, multiple))
    if levels[-1] != d_ff:
        levels.append(d_ff)
    return (0,) * allow_removal + tuple(levels)


def check_level(channels: int, d_ff: int, multiple: int, allow_removal: bool = False) -> None:
    """ValueError naming the config key a kept channel count breaks (``channel_multiple``,
    ``search.allow_removal``); None when it is a level."""
    if not 0 <= channels <= d_ff:
        raise ValueError(f"channels: {channels} kept channels is outside 0..{d_ff}")
    if channels == 0 and not allow_removal:
        raise ValueError("search.allow_removal: 0 kept channels removes the MLP, and removal is not allowed")
    if channels % multiple and channels != d_ff:
        raise ValueError(
            f"channel_multiple: {channels} kept channels is not a multiple of {multiple} (nor the dense width {d_ff})"
        )


# ----------------------------------------------------------------------------- costs
def layer_params_at(d: Mapping[str, Any], kv_groups: int, channels: int) -> tuple[int, int]:
    """(attention, MLP) parameters of one layer keeping ``kv_groups`` groups (with their query heads)
    and ``channels`` channels (``Adapter.layer_params``: biases and q/k norms per family)."""
    g = d["heads"] // d["kv_heads"]
    widths = {"kv_heads": kv_groups, "heads": kv_groups * g, "ffn": channels}
    return adapter_for(d["model_type"]).layer_params({**d, **widths})


def prunable_params(d: Mapping[str, Any], kind: str, level: int) -> int:
    """The prunable parameters one unit of ``kind`` keeps at ``level`` (``arch_dims`` numbers)."""
    i = KINDS.index(kind)
    at = (level, 0) if i == 0 else (0, level)
    return layer_params_at(d, *at)[i] - layer_params_at(d, 0, 0)[i]


def block_tensors(d: Mapping[str, Any], kv_groups: int, channels: int) -> dict[str, list[tuple[str, tuple[int, int]]]]:
    """The 2-D weights of one block by kind: (GGUF role, numpy shape (rows, row width))."""
    h, hd = d["hidden"], d["head_dim"]
    q = kv_groups * (d["heads"] // d["kv_heads"]) * hd
    kv = kv_groups * hd
    return {
        "kv_groups": [("attn_q", (q, h)), ("attn_k", (kv, h)), ("attn_v", (kv, h)), ("attn_output", (h, q))],
        "channels": [("ffn_gate", (channels, h)), ("ffn_up", (channels, h)), ("ffn_down", (h, channels))],
    }


def kind_bytes(d: Mapping[str, Any], kind: str, level: int, gguf_type: str, places: Mapping[str, Place]) -> int:
    """Bytes of one block's attention (``kv_groups``) or MLP (``channels``) at ``level`` in
    ``gguf_type``: its 2-D weights (``places``: the K-quant position of attn_v and ffn_down) and its
    1-D tensors (biases, q/k norms) in f32."""
    i = KINDS.index(kind)
    at = (level, 0) if i == 0 else (0, level)
    tensors = block_tensors(d, *at)[kind]
    two_d = sum(r * w for _, (r, w) in tensors)
    data = sum(tensor_bytes(role, shape, gguf_type, places.get(role)) for role, shape in tensors)
    return data + F32_BYTES * (layer_params_at(d, *at)[i] - two_d)


def block_bytes(
    d: Mapping[str, Any], kv_groups: int, channels: int, gguf_type: str, places: Mapping[str, Place]
) -> tuple[int, int]:
    """(attention, MLP) bytes of one block (``kind_bytes``); its two RMSNorms are in neither."""
    return (
        kind_bytes(d, "kv_groups", kv_groups, gguf_type, places),
        kind_bytes(d, "channels", channels, gguf_type, places),
    )


def _places(d: Mapping[str, Any], v_index: int, v_count: int, down_index: int) -> dict[str, Place]:
    big = d["layers"] == SEVENTY_B_BLOCKS and d["heads"] != d["kv_heads"]
    return {
        "attn_v": Place(v_index, v_count, d["tied"], big),
        "ffn_down": Place(down_index, d["layers"], d["tied"], big),
    }


def top_bytes(d: Mapping[str, Any], gguf_type: str) -> int:
    """Bytes of the tensors outside the blocks: token embedding, head (unless tied), final norm."""
    shape, tied = (int(d["vocab"]), int(d["hidden"])), bool(d["tied"])
    n = tensor_bytes("token_embd", shape, gguf_type, Place(tied=tied)) + F32_BYTES * shape[1]
    return n if tied else n + tensor_bytes("output", shape, gguf_type, Place(tied=tied))


def model_bytes(config: Any, widths: Sequence[Mapping[str, int]], gguf_type: str) -> int:
    """Bytes of tensor data of the GGUF file of ``gguf_type`` holding the model ``config`` pruned to
    ``widths`` (per layer ``{"kv_groups": k, "channels": c}``; 0 removes the block's weights),
    each attn_v / ffn_down at its position among those present (llama.cpp's counters)."""
    d = arch_dims(config_dict(config))
    check_mix_type(gguf_type)
    v_count = sum(w["kv_groups"] > 0 for w in widths)
    n, v_index, down_index = top_bytes(d, gguf_type), 0, 0
    for w in widths:
        attn, mlp = block_bytes(d, w["kv_groups"], w["channels"], gguf_type, _places(d, v_index, v_count, down_index))
        n += attn + mlp + F32_BYTES * 2 * d["hidden"]
        v_index += w["kv_groups"] > 0
        down_index += w["channels"] > 0
    return n


# ----------------------------------------------------------------------------- the space
@dataclass(frozen=True)
class Measure:
    """What a cost counts: ``params``, or ``bytes`` of ``gguf_type``."""

    name: str = "params"
    gguf_type: str | None = None


def unit_costs(d: Mapping[str, Any], kind: str, levels: Sequence[int], measure: Measure, layer: int) -> tuple[int, ...]:
    """Cost of every level of one unit (layer ``layer``; the K-quant mixes' position rule takes
    every block as present)."""
    if measure.gguf_type is None:
        return tuple(prunable_params(d, kind, v) for v in levels)
    gguf_type, places = measure.gguf_type, _places(d, layer, d["layers"], layer)
    base = kind_bytes(d, kind, 0, gguf_type, places)
    return tuple(kind_bytes(d, kind, v, gguf_type, places) - base for v in levels)


def fixed_bytes(d: Mapping[str, Any], gguf_type: str) -> int:
    """Bytes outside the units: embeddings, head, final norm, and each block's norms and fixed 1-D
    tensors (its bytes at level 0)."""
    per_block = sum(block_bytes(d, 0, 0, gguf_type, {})) + F32_BYTES * 2 * int(d["hidden"])
    return top_bytes(d, gguf_type) + int(d["layers"]) * per_block


def space_units(d: Mapping[str, Any], multiple: int, allow_removal: bool, measure: Measure) -> tuple[Unit, ...]:
    """The units of every layer with their levels and costs; layers whose costs agree share one
    computation (params: all layers; bytes: those the K-quant position rule treats alike)."""
    levels = {
        "kv_groups": kv_levels(d["kv_heads"], allow_removal),
        "channels": channel_levels(d["ffn"], multiple, allow_removal),
    }
    memo: dict[tuple[str, bool], tuple[int, ...]] = {}
    units = []
    for layer in range(d["layers"]):
        for kind in KINDS:
            key = (kind, measure.gguf_type is not None and use_more_bits(layer, d["layers"]))
            if key not in memo:
                memo[key] = unit_costs(d, kind, levels[kind], measure, layer)
            units.append(Unit(layer, kind, levels[kind], memo[key]))
    return tuple(units)


def state_cost(units: Sequence[Unit], state: Sequence[int]) -> int:
    return sum(u.costs[i] for u, i in zip(units, state, strict=True))


def lowest_state(units: Sequence[Unit]) -> tuple[int, ...]:
    """Every unit at its cheapest level."""
    return tuple(min(range(len(u.costs)), key=u.costs.__getitem__) for u in units)


def pair_state(units: Sequence[Unit], kv_groups: int, channels: int) -> tuple[int, ...]:
    """Level indices of one width in every layer."""
    return tuple(u.levels.index(kv_groups if u.kind == "kv_groups" else channels) for u in units)


def uniform_pair(d: Mapping[str, Any], rule: KeepRule, ratio: float | None = None) -> tuple[int, int]:
    """(kept KV groups, kept channels) of the uniform selection at ``ratio`` (default ``rule.ratio``)."""
    r = rule.ratio if ratio is None else ratio
    return (
        n_keep(d["kv_heads"], r, rule.group_rounding),
        aligned_keep(d["ffn"], r, rule.channel_multiple, rule.channel_rounding),
    )


def uniform_pairs(d: Mapping[str, Any], rule: KeepRule) -> set[tuple[int, int]]:
    """Every width the uniform selection gives at some ratio: its value either side of each ratio
    where a rounding of the KV groups or of the channels changes."""
    n, f, m = d["kv_heads"], d["ffn"], rule.channel_multiple
    # (1 - r) n or (1 - r) f / m crossing a whole or a half number (ceil, floor; nearest)
    cuts = {1 - j / (2 * n) for j in range(2 * n + 1)} | {1 - j * m / (2 * f) for j in range(2 * (f // m) + 3)}
    ratios = {r for b in cuts for r in (b - RATIO_EPS, b + RATIO_EPS) if 0.0 < r < 1.0}
    return {uniform_pair(d, rule, r) for r in ratios}


def fit_uniform(units: Sequence[Unit], d: Mapping[str, Any], rule: KeepRule, limit: int) -> tuple[int, ...]:
    """The uniform allocation of largest cost within ``limit`` (ties: more KV groups), among the
    widths the uniform selection gives at some ratio; every unit at its lowest level when none fits."""
    totals: dict[str, dict[int, int]] = {kind: {} for kind in KINDS}
    for u in units:
        for v, c in zip(u.levels, u.costs):
            totals[u.kind][v] = totals[u.kind].get(v, 0) + c
    fits = [
        (totals["kv_groups"][k] + totals["channels"][c], k, c)
        for k, c in uniform_pairs(d, rule)
        if totals["kv_groups"][k] + totals["channels"][c] <= limit
    ]
    if not fits:
        return lowest_state(units)
    _, k, c = max(fits)
    return pair_state(units, k, c)


def parse_budget(budget: Mapping[str, Any] | None) -> tuple[Measure, int | None]:
    """(measure, amount) of a config ``search.budget``; None: (params, None), the uniform cell's.
    ValueError (one line, naming the key) for anything else than ``{params: N}`` or
    ``{bytes: N, type: T}`` (``coec.select.search.budget_key``) with a type whose bytes are modelled."""
    key, amount, gguf_type = budget_key(budget)
    if gguf_type is None:
        return Measure(), amount
    try:
        gguf_type = check_mix_type(gguf_type)
    except ValueError as e:
        raise ValueError(f"search.budget.type: {e}") from None
    return Measure(key, gguf_type), amount


def check_budget(units: Sequence[Unit], limit: int, measure: Measure, fixed: int) -> None:
    """ValueError naming ``search.budget.<measure>`` when no allocation meets ``limit`` (the
    units' share) or the dense model already does."""
    key, total = f"search.budget.{measure.name}", limit + fixed
    low, high = sum(min(u.costs) for u in units), sum(max(u.costs) for u in units)
    if limit < low:
        raise ValueError(
            f"{key}: {total} {measure.name} cannot be met: the smallest allocation (every layer at its "
            f"lowest level) needs {low + fixed}"
        )
    if limit >= high:
        raise ValueError(f"{key}: {total} {measure.name} hold the dense model ({high + fixed}): nothing to prune")


def build_space(
    config: Any, rule: KeepRule, budget: Mapping[str, Any] | None = None, allow_removal: bool = False
) -> SearchSpace:
    """The search space of a model (``config.json`` dict or PretrainedConfig) under a budget
    (``parse_budget``): levels per ``rule.channel_multiple`` (and 0 with ``allow_removal``), costs
    in the budget's measure, the uniform allocation (at ``rule.ratio`` for the default budget,
    else the largest uniform one that fits). ValueError naming the key for a budget no allocation
    meets (or that the dense model meets)."""
    d = arch_dims(config_dict(config))
    measure, amount = parse_budget(budget)
    units = space_units(d, rule.channel_multiple, allow_removal, measure)
    if amount is None:
        uniform = pair_state(units, *uniform_pair(d, rule))
        return SearchSpace(units, state_cost(units, uniform), uniform)
    fixed = fixed_bytes(d, measure.gguf_type) if measure.gguf_type else 0
    check_budget(units, amount - fixed, measure, fixed)
    uniform = fit_uniform(units, d, rule, amount - fixed)
    return SearchSpace(units, amount - fixed, uniform, measure.name, fixed)
