"""A width search as the config names it: a ``selections`` entry with ``score: search``
(docs/search.md). Its cells flow through compensate, ppl, zeroshot, export and the tables like
any selection's; its keep.json comes from the search job instead of the select job.

    selections:
      search-rcpu:
        score: search
        candidates: rcpu-a256        # a registered selection: each level's keep set, and the levels
        compensation: coec           # a compensations entry: each level's refit (the fitness sees it)
        holdout: enwiki-16x512-holdout   # a calibration entry: the fitness tokens
        budget: null                 # null: the uniform cell's prunable params at the cell's ratio
        allocation: evolve           # evolve (EvoPress) | alam (FLAP's AL-AM over the same levels)
        generations: 8               # ... the search options (coec.select.search.SearchOptions)

Checked when the config is validated (``coec.select.search_checks``, one line naming the key);
what needs the model's shape (a budget no allocation meets, a multiple above the MLP width) is
refused when the job starts, before anything is written. This module imports nothing of the
package (``coec.select.scores`` reads it).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

#: the ``score`` of a search selection
SEARCH = "search"
#: the options of ``coec.select.search.SearchOptions``, config keys of a search entry
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
