"""The per-layer width search (docs/search.md): a ``selections`` entry with ``score: search``
whose keep.json holds per-layer widths chosen under one budget, with its cells flowing through
compensate, ppl, zeroshot, export and the tables like any selection's (its keep.json comes from
the search job instead of the select job). This module is the entry as the config names it; the
search itself is in the modules beside it:

* ``budget``: the units, their levels and costs (parameters or GGUF bytes), the budget;
* ``evolve``: EvoPress's evolutionary search over the levels (pure); ``alam``: FLAP's AL-AM;
* ``candidates``: one layer's keep set and refit at every level; ``fitness``: the KL to the
  dense model of a candidate allocation;
* ``checks``: the entry's checks at config validation; ``cli``: ``coec search``; ``stage``: its
  jobs.

    selections:
      search-rcpu:
        score: search
        candidates: rcpu-a256        # a registered selection: each level's keep set, and the levels
        compensation: coec           # a compensations entry: each level's refit (the fitness sees it)
        holdout: enwiki-16x512-holdout   # a calibration entry: the fitness tokens
        budget: null                 # null: the uniform cell's prunable params at the cell's ratio
        allocation: evolve           # evolve (EvoPress) | alam (FLAP's AL-AM over the same levels)
        generations: 8               # ... the search options (coec.select.search.evolve.SearchOptions)

Checked when the config is validated (``coec.select.search.checks``, one line naming the key);
what needs the model's shape (a budget no allocation meets, a multiple above the MLP width) is
refused when the job starts, before anything is written. This module imports nothing of the
package (``coec.select.scores`` and the workflow's planning read it).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

#: the ``score`` of a search selection
SEARCH = "search"
#: the options of ``coec.select.search.evolve.SearchOptions``, config keys of a search entry
OPTION_KEYS = ("generations", "offspring", "survivors", "tokens", "seed", "tolerance", "max_switches")
#: how a search allocates the levels: EvoPress's evolutionary search, or FLAP's AL-AM
ALLOCATIONS = ("evolve", "alam")
#: every key of a search entry
SEARCH_KEYS = ("score", "candidates", "compensation", "holdout", "budget", "allocation", *OPTION_KEYS)


def is_search(entry: Any) -> bool:
    """Whether a ``selections`` entry is a width search."""
    return isinstance(entry, Mapping) and entry.get("score") == SEARCH


def search_entries(config: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """The config's search selections by name (filled from the schema once validated)."""
    return {name: dict(e) for name, e in (config.get("selections") or {}).items() if is_search(e)}


def rekey(message: str, name: str) -> str:
    """A search core message (keys ``search.<key>``) with the config key of selection ``name``."""
    return message.replace("search.", f"selections.{name}.")


def budget_key(budget: Mapping[str, Any] | None) -> tuple[str, int | None, str | None]:
    """(measure, amount, GGUF type) of a config ``search.budget`` as written: None is
    (params, None, None), the uniform cell's; ``{params: N}``; ``{bytes: N, type: T}`` (whether
    the bytes of type T are modelled is ``coec.select.search.budget.parse_budget``'s). ValueError
    (one line, naming the key) for anything else."""
    if budget is None:
        return "params", None, None
    extra = sorted(set(budget) - {"params", "bytes", "type"})
    if extra or ("params" in budget) == ("bytes" in budget):
        what = f"unknown key {extra[0]!r}" if extra else "give exactly one of params, bytes"
        raise ValueError(f"search.budget: {what}; expected {{params: N}} or {{bytes: N, type: T}}")
    key = "params" if "params" in budget else "bytes"
    amount = budget[key]
    if isinstance(amount, bool) or not isinstance(amount, int) or amount < 1:
        raise ValueError(f"search.budget.{key} must be a positive integer, got {amount!r}")
    if key == "params":
        if "type" in budget:
            raise ValueError("search.budget.type: a params budget has no GGUF type (it belongs to a bytes budget)")
        return key, amount, None
    return key, amount, str(budget.get("type"))
