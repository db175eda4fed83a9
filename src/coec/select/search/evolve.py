"""Evolutionary search of per-layer widths under one budget (EvoPress, arXiv 2410.14649; DarwinLM
and Týr-the-Pruner search widths the same way). Pure: a space, a fitness and options in, plain
results out; no I/O; one ``random.Random(seed)`` draws everything.

State: one level index per unit of a ``coec.select.search.budget.SearchSpace``. The fitness is the
caller's ``fitness(levels, n_tokens) -> float`` (lower is better; ``levels``: kept counts per
unit, layer by layer, KV groups then channels, ``SearchSpace.values``).

Budget band. Every candidate costs within [ceil((1 - tolerance) B), B]: never more than the
budget B, at most ``tolerance`` x B less. EvoPress's level switch between units of one size
raises one unit a level and lowers another, which keeps the total exactly; a KV group and an MLP
channel cost different amounts (and bytes follow each tensor's type), so here a switch raises one
random unit a level, then lowers other random units (each by the fewest levels that bring the
total within the budget, else to its cheapest) until the total is at most B, then raises random
units it did not lower and that still fit (each by the fewest levels that reach the band, else
the most that fit) until it is in the band. A mutation that cannot reach the band, changes
nothing or repeats a candidate is drawn again (at most ``MAX_TRIES`` times, then that offspring
is skipped). The band is wider than the dearest single step in practice (0.5 % of a 7B model's
prunable parameters is about 5 KV groups or 2000 channels); a band no allocation reaches from
the uniform one is refused (``repair``: ``search.tolerance``).

Generation (EvoPress's (1 + lambda) scheme, ``evo_quant_search.py``, with a population of
``survivors[-1]``): ``offspring`` distinct mutants of random parents, none a parent, each of 1 to
``max_switches`` switches (the smaller of two uniform draws, as EvoPress draws its flips). The
mutants pass the selection stages: stage s scores every remaining candidate with
``fitness(levels, tokens[s])`` and keeps the ``survivors[s]`` best (ties: the earlier candidate);
the parents join at the last stage (elitism: a parent is scored again there, on the most tokens,
and stays unless beaten). The last stage's survivors are the next parents.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the options (config validation) need no budget, whose byte counts load torch
    from coec.select.search.budget import SearchSpace, Unit

State = tuple[int, ...]
#: fitness(levels, n_tokens) -> float, lower is better
Fitness = Callable[[tuple[int, ...], int], float]
#: mutation(space, parent, rng, band, max_switches) -> a state in the band, or None (draw again)
Mutation = Callable[["SearchSpace", State, random.Random, tuple[int, int], int], State | None]
MAX_TRIES = 64  # draws of one offspring before it is skipped


@dataclass(frozen=True)
class SearchOptions:
    """The search's settings (config ``search``; no defaults here: the config schema holds them).

    ``survivors[s]`` candidates survive stage s, scored on ``tokens[s]`` tokens (survivors not
    increasing, tokens not decreasing); ``survivors[-1]`` is the population. ``tolerance``: how far
    below the budget a candidate may cost, as a fraction of it."""

    generations: int
    offspring: int
    survivors: tuple[int, ...]
    tokens: tuple[int, ...]
    seed: int
    tolerance: float
    max_switches: int

    def __post_init__(self) -> None:
        object.__setattr__(self, "survivors", tuple(self.survivors))
        object.__setattr__(self, "tokens", tuple(self.tokens))
        check_options(self)


def _positive_int(key: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"search.{key} must be a positive integer, got {value!r}")


def check_options(o: SearchOptions) -> None:
    """ValueError (one line, naming the key) for options the search cannot run."""
    for key in ("generations", "offspring", "max_switches"):
        _positive_int(key, getattr(o, key))
    for key in ("survivors", "tokens"):
        for v in getattr(o, key):
            _positive_int(key, v)
    if not o.survivors or len(o.survivors) != len(o.tokens):
        raise ValueError(
            f"search.survivors: one count per stage of search.tokens ({len(o.tokens)}), got {len(o.survivors)}"
        )
    if any(b > a for a, b in zip(o.survivors, o.survivors[1:])):
        raise ValueError(f"search.survivors must not increase from stage to stage, got {list(o.survivors)}")
    if any(b < a for a, b in zip(o.tokens, o.tokens[1:])):
        raise ValueError(f"search.tokens must not decrease from stage to stage, got {list(o.tokens)}")
    if isinstance(o.seed, bool) or not isinstance(o.seed, int):
        raise ValueError(f"search.seed must be an integer, got {o.seed!r}")
    if not 0.0 <= o.tolerance < 1.0:
        raise ValueError(f"search.tolerance must lie in [0, 1), got {o.tolerance}")


@dataclass(frozen=True)
class Generation:
    """One generation's record: the best fitness (last stage), and evaluations and tokens so far."""

    generation: int
    best: float
    evaluations: int
    tokens: int


@dataclass(frozen=True)
class SearchResult:
    """The best allocation found: level indices, kept counts per unit, its cost and fitness (at
    the last stage's tokens), and the fitness curve."""

    state: State
    levels: tuple[int, ...]
    cost: int
    fitness: float
    curve: tuple[Generation, ...]

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Tally:
    """Fitness evaluations and tokens evaluated so far."""

    evaluations: int = 0
    tokens: int = 0


# ----------------------------------------------------------------------------- the band
def band(space: SearchSpace, tolerance: float) -> tuple[int, int]:
    """(lowest, highest) cost a candidate may have: ceil((1 - tolerance) B), B."""
    return math.ceil((1.0 - tolerance) * space.budget), space.budget


def in_band(space: SearchSpace, state: Sequence[int], limits: tuple[int, int]) -> bool:
    return limits[0] <= space.cost(state) <= limits[1]


def _lowers(unit: Unit, i: int) -> bool:
    """Whether some lower level of ``unit`` costs less than level ``i``."""
    return i > 0 and unit.floor[i - 1] < unit.costs[i]


def _rises(unit: Unit, i: int, cost: int, hi: int) -> bool:
    """Whether one level up from ``i`` adds to ``cost`` and stays at most ``hi``."""
    return i + 1 < len(unit.costs) and cost < cost - unit.costs[i] + unit.costs[i + 1] <= hi


def lower_to(space: SearchSpace, s: list[int], cost: int, hi: int, rng: random.Random, frozen: set[int]) -> int | None:
    """Lower random units (not ``frozen``) until the cost is at most ``hi``: each by the fewest
    levels that get there, else to its cheapest level below. Changes ``s``; returns the cost, or
    None when no unit can lower it further."""
    while cost > hi:
        down = [u for u, i in enumerate(s) if u not in frozen and _lowers(space.units[u], i)]
        if not down:
            return None
        u = rng.choice(down)
        costs, i = space.units[u].costs, s[u]
        j = next((j for j in range(i - 1, -1, -1) if cost - costs[i] + costs[j] <= hi), None)
        if j is None:
            j = min(range(i), key=costs.__getitem__)
        cost += costs[j] - costs[i]
        s[u] = j
    return cost


def raise_to(
    space: SearchSpace, s: list[int], cost: int, limits: tuple[int, int], rng: random.Random, frozen: set[int]
) -> int | None:
    """Raise random units (not ``frozen``) that still fit until the cost is at least ``limits[0]``:
    each by the fewest levels that reach it, else the most that fit. Changes ``s``; returns the
    cost, or None when no unit fits."""
    lo, hi = limits
    while cost < lo:
        up = [u for u, i in enumerate(s) if u not in frozen and _rises(space.units[u], i, cost, hi)]
        if not up:
            return None
        u = rng.choice(up)
        costs, i = space.units[u].costs, s[u]
        j = i + 1
        while cost - costs[i] + costs[j] < lo and _rises(space.units[u], j, cost - costs[i] + costs[j], hi):
            j += 1
        cost += costs[j] - costs[i]
        s[u] = j
    return cost


def switch(space: SearchSpace, s: list[int], cost: int, rng: random.Random, limits: tuple[int, int]) -> int | None:
    """One level switch on ``s`` (changed in place): raise a random unit one level, lower others
    until within the budget, raise units that were not lowered until within the band. Returns the
    new cost, or None when the band cannot be reached."""
    up = [u for u, i in enumerate(s) if i + 1 < len(space.units[u].costs)]
    if not up:
        return None
    a = rng.choice(up)
    costs = space.units[a].costs
    cost += costs[s[a] + 1] - costs[s[a]]
    s[a] += 1
    before = list(s)
    lowered = lower_to(space, s, cost, limits[1], rng, {a})
    if lowered is None:
        return None
    return raise_to(space, s, lowered, limits, rng, {u for u, (x, y) in enumerate(zip(before, s)) if x != y})


def level_switch(
    space: SearchSpace, parent: State, rng: random.Random, limits: tuple[int, int], max_switches: int
) -> State | None:
    """EvoPress's mutation for heterogeneous costs (module docstring): 1 to ``max_switches``
    switches; the mutant, or None when it left the band or equals ``parent``."""
    s, cost = list(parent), space.cost(parent)
    for _ in range(min(rng.randint(1, max_switches), rng.randint(1, max_switches))):
        new = switch(space, s, cost, rng, limits)
        if new is None:
            return None
        cost = new
    state = tuple(s)
    return state if state != parent and limits[0] <= cost <= limits[1] else None


def repair(space: SearchSpace, state: Sequence[int], rng: random.Random, limits: tuple[int, int]) -> State:
    """``state`` brought into the band: lowered, then raised, at random; each retry (at most
    ``MAX_TRIES``) first lowers a random half of the units to random levels. ValueError naming
    ``search.tolerance`` when no try reaches the band."""
    for attempt in range(MAX_TRIES):
        s = list(state)
        for u in rng.sample(range(len(s)), len(s) // 2) if attempt else ():
            s[u] = rng.randint(0, s[u])
        cost = lower_to(space, s, space.cost(s), limits[1], rng, set())
        if cost is not None and raise_to(space, s, cost, limits, rng, set()) is not None:
            return tuple(s)
    raise ValueError(
        f"search.tolerance: no allocation within [{limits[0]}, {limits[1]}] {space.measure} was reached "
        f"from {space.cost(state)}; widen the tolerance"
    )


# ----------------------------------------------------------------------------- the search
def check_in_band(space: SearchSpace, state: State, limits: tuple[int, int]) -> None:
    """RuntimeError when a candidate left the band (a mutation that does not keep the budget)."""
    space.check(state)
    if not in_band(space, state, limits):
        raise RuntimeError(
            f"a mutation left the budget band: cost {space.cost(state)} outside [{limits[0]}, {limits[1]}]"
        )


def breed(
    space: SearchSpace, parents: Sequence[State], rng: random.Random, options: SearchOptions, mutation: Mutation, n: int
) -> list[State]:
    """``n`` distinct mutants of random parents, none a parent (a draw that fails or repeats is
    drawn again; an offspring that fails ``MAX_TRIES`` draws is skipped)."""
    limits, kids, seen = band(space, options.tolerance), [], set(parents)
    for _ in range(n):
        for _ in range(MAX_TRIES):
            kid = mutation(space, rng.choice(parents), rng, limits, options.max_switches)
            if kid is not None and kid not in seen:
                kids.append(kid)
                seen.add(kid)
                break
    return kids


def select(
    space: SearchSpace,
    kids: list[State],
    parents: Sequence[State],
    fitness: Fitness,
    options: SearchOptions,
    tally: Tally,
) -> tuple[list[State], float]:
    """The multi-step selection (EvoPress's): the mutants pass the stages, the parents join them
    at the last; returns (the last stage's survivors, best first; the best fitness)."""
    candidates, scores, last = list(kids), [math.inf], len(options.tokens) - 1
    for stage, (tokens, keep) in enumerate(zip(options.tokens, options.survivors)):
        if stage == last:
            candidates += [p for p in parents if p not in candidates]
        scores = [float(fitness(space.values(c), tokens)) for c in candidates]
        if any(math.isnan(x) for x in scores):
            raise ValueError(f"the fitness returned NaN on {tokens} tokens")
        tally.evaluations += len(candidates)
        tally.tokens += len(candidates) * tokens
        order = sorted(range(len(candidates)), key=lambda i: (scores[i], i))[:keep]
        candidates, scores = [candidates[i] for i in order], [scores[i] for i in order]
    return candidates, scores[0]


def evolve(
    space: SearchSpace, fitness: Fitness, options: SearchOptions, mutation: Mutation = level_switch
) -> SearchResult:
    """The evolutionary search (module docstring) from the uniform allocation brought into the band."""
    rng = random.Random(options.seed)
    limits, tally, curve = band(space, options.tolerance), Tally(), []
    start = repair(space, space.uniform, rng, limits)
    parents = [start, *breed(space, [start], rng, options, mutation, options.survivors[-1] - 1)]
    best = math.inf
    for generation in range(options.generations):
        kids = breed(space, parents, rng, options, mutation, options.offspring)
        for c in [*parents, *kids]:
            check_in_band(space, c, limits)
        parents, best = select(space, kids, parents, fitness, options, tally)
        curve.append(Generation(generation, best, tally.evaluations, tally.tokens))
    return SearchResult(parents[0], space.values(parents[0]), space.cost(parents[0]), best, tuple(curve))
