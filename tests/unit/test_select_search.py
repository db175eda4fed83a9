"""coec.select.search.evolve and coec.select.search.alam: every mutation keeps the budget band (and a
mutation without its compensating move is caught), the search finds the exact optimum of
separable fitnesses (dynamic programming) and beats the uniform allocation, the multi-step
selection, determinism, AL-AM, and the refusals."""

from __future__ import annotations

import math
import random

import pytest
import torch

from coec.iterative.state import PruneState
from coec.iterative.structure import alam_keep
from coec.model.arch import AttnShape
from coec.select.scores import KeepRule
from coec.select.search.alam import alam_state, step_scores, unit_scores
from coec.select.search.budget import SearchSpace, Unit, build_space, check_level, model_bytes
from coec.select.search.evolve import SearchOptions, band, evolve, level_switch, repair

FAMILIES = ("llama", "qwen2", "qwen3", "mistral", "granite")


def options(**over):
    base = dict(generations=60, offspring=16, survivors=(4, 1), tokens=(1, 2), seed=0, tolerance=0.005, max_switches=3)
    return SearchOptions(**(base | over))


def config(rng: random.Random) -> dict:
    kv, g = rng.choice([1, 2, 4, 8]), rng.choice([1, 2, 4])
    return {
        "model_type": rng.choice(FAMILIES),
        "hidden_size": rng.choice([64, 128, 256, 320]),
        "num_attention_heads": kv * g,
        "num_key_value_heads": kv,
        "head_dim": rng.choice([8, 16, 32, 64]),
        "intermediate_size": rng.choice([96, 128, 200, 256, 512, 768]),
        "num_hidden_layers": rng.randint(1, 6),
        "vocab_size": 500,
        "tie_word_embeddings": rng.random() < 0.5,
        "attention_bias": rng.random() < 0.3,
        "mlp_bias": rng.random() < 0.3,
    }


def random_space(seed: int) -> SearchSpace:
    """A model of random shape under a random budget: the uniform cell's params, a params
    amount or a byte budget of a random GGUF type, block removal on or off."""
    rng = random.Random(seed)
    cfg = config(rng)
    rule = KeepRule(rng.uniform(0.1, 0.9), channel_multiple=rng.choice([1, 8, 32, 64]))
    allow = rng.random() < 0.3
    kind = rng.choice(["cell", "params", "bytes"])
    if kind == "cell":
        return build_space(cfg, rule, None, allow)
    dense = build_space(cfg, rule, None, allow)
    if kind == "params":
        hi = sum(max(u.costs) for u in dense.units)
        return build_space(cfg, rule, {"params": int(hi * rng.uniform(0.3, 0.95))}, allow)
    gguf_type = rng.choice(["q4_k_m", "q5_k_m", "q6_k", "q8_0", "q4_0", "f16"])
    widths = [{"kv_groups": cfg["num_key_value_heads"], "channels": cfg["intermediate_size"]}]
    total = model_bytes(cfg, widths * cfg["num_hidden_layers"], gguf_type)
    return build_space(cfg, rule, {"bytes": int(total * rng.uniform(0.75, 0.99)), "type": gguf_type}, allow)


def walk_in_band(mutation, seeds, steps: int = 25) -> tuple[int, int]:
    """Random walks of mutants (each the next parent) over random spaces: every mutant costs
    within the band (AssertionError otherwise); returns (spaces walked, mutants)."""
    walked = mutants = 0
    for seed in seeds:
        try:
            space = random_space(seed)
        except ValueError as e:  # a random budget below the smallest allocation
            assert "cannot be met" in str(e) or "nothing to prune" in str(e), e
            continue
        rng = random.Random(seed)
        tol = rng.choice([0.0, 0.001, 0.005, 0.02, 0.1])
        limits = band(space, tol)
        try:
            state = repair(space, space.uniform, rng, limits)
        except ValueError as e:  # levels too coarse for this tolerance
            assert str(e).startswith("search.tolerance:"), e
            continue
        walked += 1
        for _ in range(steps):
            kid = mutation(space, state, rng, limits, rng.randint(1, 4))
            if kid is None:
                continue
            space.check(kid)
            cost = space.cost(kid)
            assert limits[0] <= cost <= limits[1], (seed, cost, limits)
            assert kid != state
            state, mutants = kid, mutants + 1
    return walked, mutants


def broken_switch(space, parent, rng, limits, max_switches):
    """A level switch without its compensating move: raise a unit, lower nothing."""
    s = list(parent)
    u = rng.choice([u for u, i in enumerate(s) if i + 1 < len(space.units[u].levels)])
    s[u] += 1
    return tuple(s)


# ----------------------------------------------------------------------------- the band
def test_a_mutation_never_leaves_the_budget_band():
    walked, mutants = walk_in_band(level_switch, range(150))
    assert walked >= 100 and mutants >= 1500


def test_a_mutation_without_its_compensating_move_is_caught():
    with pytest.raises(AssertionError):
        walk_in_band(broken_switch, range(20))
    space = build_space(config(random.Random(3)) | {"num_hidden_layers": 4}, KeepRule(0.5, channel_multiple=8))
    with pytest.raises(RuntimeError, match="a mutation left the budget band"):
        evolve(space, lambda levels, n: 0.0, options(), mutation=broken_switch)


def test_band_is_the_budget_and_the_tolerance_below_it():
    space = SearchSpace((Unit(0, "channels", (1, 2, 3), (10, 20, 30)),), 1000, (0,))
    assert band(space, 0.005) == (995, 1000) and band(space, 0.0) == (1000, 1000)


# ----------------------------------------------------------------------------- the optimum
def separable(space: SearchSpace, seed: int):
    """A separable convex fitness: sum over units of w_u (1 - level / width)^2."""
    g = torch.Generator().manual_seed(seed)
    w = (torch.rand(len(space.units), generator=g, dtype=torch.float64) * 4 + 0.5).tolist()
    tops = [u.levels[-1] for u in space.units]

    def unit_value(k: int, level: int) -> float:
        return w[k] * (1.0 - level / tops[k]) ** 2

    def fitness(levels, n_tokens):
        return sum(unit_value(k, v) for k, v in enumerate(levels))

    return fitness, unit_value


def dp_optimum(space: SearchSpace, unit_value, limits) -> float:
    """The exact minimum of a separable fitness over the allocations costing within ``limits``."""
    best = {0: 0.0}
    for k, u in enumerate(space.units):
        nxt: dict[int, float] = {}
        for c, v in best.items():
            for level, cost in zip(u.levels, u.costs):
                if c + cost <= limits[1]:
                    nxt[c + cost] = min(nxt.get(c + cost, math.inf), v + unit_value(k, level))
        best = nxt
    return min(v for c, v in best.items() if c >= limits[0])


def tiny_model(layers: int = 4) -> dict:
    return {
        "model_type": "llama",
        "hidden_size": 64,
        "num_attention_heads": 8,
        "num_key_value_heads": 4,
        "head_dim": 8,
        "intermediate_size": 128,
        "num_hidden_layers": layers,
        "vocab_size": 100,
    }


@pytest.mark.parametrize(("seed", "tolerance"), [(0, 0.0), (1, 0.0), (2, 0.05), (3, 0.02)])
def test_the_search_finds_the_optimum_of_a_separable_fitness_and_beats_uniform(seed, tolerance):
    # a KV group costs 2 hd (g + 1) d = 3072 parameters, a block of 8 channels 3 d 8 = 1536
    space = build_space(tiny_model(), KeepRule(0.5, channel_multiple=8))
    fitness, unit_value = separable(space, seed)
    limits = band(space, tolerance)
    best = dp_optimum(space, unit_value, limits)
    result = evolve(space, fitness, options(generations=150, seed=seed, tolerance=tolerance))
    uniform = fitness(space.values(space.uniform), 1)
    assert result.fitness == pytest.approx(best, rel=1e-12, abs=1e-12)
    assert result.fitness < uniform - 1e-6
    assert limits[0] <= result.cost <= limits[1] and result.cost == space.cost(result.state)
    assert [g.best for g in result.curve][-1] == result.fitness
    for u, v in zip(space.units, result.levels):  # every level a width the model can take
        if u.kind == "channels":
            check_level(v, 128, 8)


def test_the_search_finds_the_optimum_with_heterogeneous_unit_costs():
    rng = random.Random(5)
    units = []
    for k in range(6):
        steps = [rng.randint(1, 7) for _ in range(5)]
        costs = [rng.randint(0, 3)]
        for s in steps:
            costs.append(costs[-1] + s)
        units.append(Unit(k // 2, ("kv_groups", "channels")[k % 2], tuple(range(1, 7)), tuple(costs)))
    lowest = tuple(0 for _ in units)
    budget = sum(u.costs[i] for u, i in zip(units, (3, 2, 4, 1, 5, 3)))  # one allocation meets it exactly
    space = SearchSpace(tuple(units), budget, lowest)
    fitness, unit_value = separable(space, 9)
    for tolerance in (0.0, 0.03):
        best = dp_optimum(space, unit_value, band(space, tolerance))
        result = evolve(space, fitness, options(generations=120, tolerance=tolerance))
        assert result.fitness == pytest.approx(best, rel=1e-12)


# ----------------------------------------------------------------------------- the schedule
def test_the_multi_step_selection_scores_survivors_on_more_tokens():
    space = build_space(tiny_model(), KeepRule(0.5, channel_multiple=8))
    fitness, _ = separable(space, 0)
    calls = []

    def recording(levels, n_tokens):
        calls.append(n_tokens)
        return fitness(levels, n_tokens)

    opts = options(generations=3, offspring=10, survivors=(6, 3, 2), tokens=(100, 400, 1600))
    result = evolve(space, recording, opts)
    # each generation: 10 mutants on 100 tokens, the best 6 on 400, the best 3 and the 2 parents on 1600
    assert (calls.count(100), calls.count(400), calls.count(1600)) == (3 * 10, 3 * 6, 3 * 5)
    assert calls[:10] == [100] * 10 and calls[10:16] == [400] * 6 and calls[16:21] == [1600] * 5
    last = result.curve[-1]
    assert last.evaluations == len(calls) and last.tokens == sum(calls)
    assert [g.generation for g in result.curve] == [0, 1, 2]
    assert all(b.best <= a.best for a, b in zip(result.curve, result.curve[1:]))  # the best parent survives
    assert result.as_dict()["curve"][0]["evaluations"] == result.curve[0].evaluations


def test_same_seed_same_result():
    space = build_space(tiny_model(6), KeepRule(0.4, channel_multiple=8))
    fitness, _ = separable(space, 4)
    a, b = evolve(space, fitness, options(seed=11)), evolve(space, fitness, options(seed=11))
    assert a == b
    assert evolve(space, fitness, options(seed=12)).curve != a.curve  # the seed draws the mutations


def test_a_byte_budget_search_stays_within_the_file_size():
    cfg = tiny_model(6) | {"hidden_size": 256, "head_dim": 32, "intermediate_size": 768, "vocab_size": 1000}
    dense = model_bytes(cfg, [{"kv_groups": 4, "channels": 768}] * 6, "q4_k_m")
    space = build_space(cfg, KeepRule(0.5, channel_multiple=32), {"bytes": dense * 3 // 4, "type": "q4_k_m"})
    fitness, _ = separable(space, 1)
    result = evolve(space, fitness, options(generations=40, tolerance=0.02))
    size = model_bytes(cfg, space.widths(result.state), "q4_k_m")
    assert size <= dense * 3 // 4 and size - space.fixed >= 0.98 * space.budget
    assert result.fitness < fitness(space.values(space.uniform), 1)


def test_a_dense_file_budget_is_the_dense_models_bytes_spent_in_another_type():
    """``{dense: D, type: T}``: the bytes of the dense model's file of type D, which the search
    spends on a file of type T; D = T holds the dense model (nothing to prune) and a mix whose bytes
    are not modelled is refused naming ``budget.dense``."""
    from coec.select.search.stage import resolve_budget

    cfg = tiny_model(6) | {"hidden_size": 256, "head_dim": 32, "intermediate_size": 768, "vocab_size": 1000}
    dense = [{"kv_groups": 4, "channels": 768}] * 6
    rule = KeepRule(0.3, channel_multiple=256)
    got = resolve_budget(cfg, rule, {"dense": "q4_0", "type": "q4_k_m"})
    assert got == {"bytes": model_bytes(cfg, dense, "q4_0"), "type": "q4_k_m"}
    assert model_bytes(cfg, dense, "q4_0") < model_bytes(cfg, dense, "q4_k_m")  # so a q4_k_m file must prune
    space = build_space(cfg, rule, got)
    assert space.budget + space.fixed == got["bytes"]
    assert model_bytes(cfg, space.widths(space.uniform), "q4_k_m") <= got["bytes"]
    with pytest.raises(ValueError, match="hold the dense model"):
        build_space(cfg, rule, resolve_budget(cfg, rule, {"dense": "q4_k_m", "type": "q4_k_m"}))
    with pytest.raises(ValueError, match=r"^search\.budget\.dense: the bytes of a q3_k_m file are not modelled"):
        resolve_budget(cfg, rule, {"dense": "q3_k_m", "type": "q4_k_m"})


# ----------------------------------------------------------------------------- AL-AM
def flap_scores(layers: int, n_kv: int, cols: int, d_ff: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    # standardised per layer, scales vanish: the layers differ in the shape of their distributions
    return [
        (torch.rand(n_kv * cols, generator=g) ** (1 + 2 * i), torch.rand(d_ff, generator=g) ** (3 - i / 2))
        for i in range(layers)
    ]


def test_alam_takes_steps_in_one_global_order_within_the_budget():
    space = build_space(tiny_model(), KeepRule(0.5, channel_multiple=8))
    scores = flap_scores(4, 4, 16, 128, 0)
    state = alam_state(space, scores)
    assert space.cost(state) <= space.budget
    steps = [step_scores(u, unit_scores(u, *scores[u.layer])) for u in space.units]
    taken = [x for k, xs in enumerate(steps) for x in xs[: state[k]]]
    untaken = [x for k, xs in enumerate(steps) for x in xs[state[k] :]]
    assert taken and untaken and min(taken) >= max(untaken)  # one global threshold
    first = max(range(len(steps)), key=lambda k: steps[k][state[k]] if state[k] < len(steps[k]) else -math.inf)
    costs = space.units[first].costs
    assert space.cost(state) + costs[state[first] + 1] - costs[state[first]] > space.budget  # it does not fit
    assert space.widths(state) != space.widths(space.uniform)


def test_alam_agrees_with_flaps_own_structure_at_one_channel_a_step():
    """With channel_multiple 1 every step is one unit, as in ``iterative.structure.alam_keep``;
    under its parameter budget (there the prefix closest to it, here the longest within it) the
    kept counts agree but for the one unit at the threshold."""
    cfg = tiny_model()
    geom, layers, d_ff, ratio = AttnShape(8, 4, 8), 4, 128, 0.5
    scores = flap_scores(layers, 4, 16, d_ff, 1)
    flap = alam_keep(scores, [geom] * layers, PruneState(geom, d_ff, [], []), 64, ratio)
    budget = int((1 - ratio) * layers * (4 * 3072 + d_ff * 192))
    space = build_space(cfg, KeepRule(ratio), {"params": budget})
    ours = space.widths(alam_state(space, scores))
    diff = [(len(g) - w["kv_groups"], len(c) - w["channels"]) for (g, c), w in zip(flap, ours, strict=True)]
    assert sum(abs(a) + abs(b) for a, b in diff) <= 1, diff


def test_alam_of_identical_layers_is_near_uniform():
    space = build_space(tiny_model(), KeepRule(0.5, channel_multiple=8))
    one = flap_scores(1, 4, 16, 128, 2)[0]
    widths = space.widths(alam_state(space, [one] * 4))
    for kind, step in (("kv_groups", 1), ("channels", 8)):
        got = [w[kind] for w in widths]
        assert max(got) - min(got) <= step


# ----------------------------------------------------------------------------- refusals
@pytest.mark.parametrize(
    ("over", "match"),
    [
        ({"generations": 0}, r"^search\.generations must be a positive integer"),
        ({"offspring": 2.5}, r"^search\.offspring must be a positive integer"),
        ({"survivors": (4, 8), "tokens": (1, 2)}, r"^search\.survivors must not increase"),
        ({"survivors": (4,), "tokens": (1, 2)}, r"^search\.survivors: one count per stage of search\.tokens"),
        ({"tokens": (4, 2)}, r"^search\.tokens must not decrease"),
        ({"tokens": (0, 2)}, r"^search\.tokens must be a positive integer"),
        ({"tolerance": 1.0}, r"^search\.tolerance must lie in \[0, 1\)"),
        ({"seed": "x"}, r"^search\.seed must be an integer"),
        ({"max_switches": 0}, r"^search\.max_switches must be a positive integer"),
    ],
)
def test_bad_options_are_refused_naming_the_key(over, match):
    with pytest.raises(ValueError, match=match):
        options(**over)


def test_a_band_no_allocation_reaches_is_refused_naming_the_tolerance():
    space = SearchSpace((Unit(0, "channels", (1, 2, 3), (10, 20, 30)),), 25, (1,))
    with pytest.raises(ValueError, match=r"^search\.tolerance: no allocation within \[25, 25\]"):
        evolve(space, lambda levels, n: 0.0, options(tolerance=0.0))


def test_a_nan_fitness_is_refused():
    space = build_space(tiny_model(), KeepRule(0.5, channel_multiple=8))
    with pytest.raises(ValueError, match="the fitness returned NaN"):
        evolve(space, lambda levels, n: math.nan, options(generations=1))
