"""The checks of a width search's config entry (``coec.select.search``; docs/search.md), run
when the config is validated (``coec.config.validate``): one line naming the key. No torch (the
config validation loads none): what needs the model or the byte counts is the job's."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from coec.compensate.inputs import Job, OtherCalibration, OtherCell
from coec.compensate.options import method, resolve, top_level_options, validate_spec
from coec.export.formats import GGUF_TYPES
from coec.select.scores import selection_registry
from coec.select.search import OPTION_KEYS, SEARCH_KEYS, budget_key, is_search, rekey, search_entries
from coec.select.search.evolve import SearchOptions


def search_options(entry: Mapping[str, Any], name: str) -> Any:
    """The ``SearchOptions`` of a search entry; ValueError naming the key."""
    try:
        return SearchOptions(**{k: entry[k] for k in OPTION_KEYS})
    except ValueError as exc:
        raise ValueError(rekey(str(exc), name)) from None


def check_search_entries(config: Mapping[str, Any]) -> None:
    """Every search selection of a validated config: its candidates a registered selection that
    is no search, its compensation one whose method reads no other workflow file, its held-out
    calibration set with enough tokens, its budget and options. ValueError, one line."""
    plain = {n: e for n, e in (config.get("selections") or {}).items() if not is_search(e)}
    known = selection_registry(plain)
    for name, entry in search_entries(config).items():
        where = f"selections.{name}"
        foreign = [k for k in entry if k not in SEARCH_KEYS]
        if foreign:
            raise ValueError(
                f"{where}.{foreign[0]}: a search takes no {foreign[0]} (its levels and keep sets are its "
                f"candidates' selection's, {where}.candidates)"
            )
        cand = entry["candidates"]
        if cand not in known:
            what = (
                "is itself a search" if is_search((config.get("selections") or {}).get(cand)) else "is not registered"
            )
            raise ValueError(f"{where}.candidates: selection {cand!r} {what} (known: {', '.join(known)})")
        _check_compensation(config, entry["compensation"], f"{where}.compensation")
        _check_holdout(config, entry, where)
        _check_budget(entry.get("budget"), where)
        uniform = (entry.get("budget") or {}).get("uniform")
        if uniform is not None and uniform not in known:
            raise ValueError(
                f"{where}.budget.uniform: selection {uniform!r} is not registered or is a search "
                f"(known: {', '.join(known)})"
            )
        search_options(entry, name)


def _check_compensation(config: Mapping[str, Any], comp: str, where: str) -> None:
    """A compensations entry whose method's workflow inputs a candidates job can give it: another
    calibration's Grams (blend's holdout), or another cell's weights (blend's base), which are
    then that compensation's candidates (itself checked here). A plug-in's own kind of input
    that names a workflow file is refused."""
    comps = config.get("compensations") or {}
    if comp not in comps:
        raise ValueError(f"{where}: unknown compensations entry {comp!r} (known: {', '.join(comps) or 'none'})")
    validate_spec(comps[comp], f"compensations.{comp}")  # its own key in the message, as validation's
    m = method(comps[comp]["method"])
    options = resolve(m.name, top_level_options(comps[comp]))
    job = Job(model="m", calib="c", select="s", ratio="0.5", first=0, last=0)
    for inp in m.inputs:
        if isinstance(inp, OtherCell):
            _check_compensation(config, getattr(options, inp.option), f"compensations.{comp}.{inp.option}")
        elif not isinstance(inp, OtherCalibration) and inp.workflow_path(options, job) is not None:
            raise ValueError(
                f"{where}: {comp!r} ({m.name}) reads a workflow file a search's candidates cannot give it "
                f"({inp.name}); a candidates' method may read the cell's Grams, another calibration's Grams "
                "and another compensation's candidates"
            )


def _check_holdout(config: Mapping[str, Any], entry: Mapping[str, Any], where: str) -> None:
    """The held-out calibration set exists and holds the last stage's tokens."""
    calibs = config.get("calibration") or {}
    holdout = entry["holdout"]
    if holdout not in calibs:
        raise ValueError(
            f"{where}.holdout: unknown calibration entry {holdout!r} (known: {', '.join(calibs) or 'none'})"
        )
    have = int(calibs[holdout]["nsamples"]) * int(calibs[holdout]["seqlen"])
    need = max(entry["tokens"])
    if need > have:
        raise ValueError(
            f"{where}.tokens: {need} fitness tokens, but calibration.{holdout} holds {have} (nsamples x seqlen)"
        )


def _check_budget(budget: Any, where: str) -> None:
    """``null``, ``{uniform: S}`` (selection S's uniform cell's params), ``{type: T}`` (the uniform
    cell's bytes), ``{dense: D, type: T}`` (the dense model's bytes in D), ``{params: N}`` or
    ``{bytes: N, type: T}``
    with T a GGUF type (whether its bytes are modelled: the job's ``parse_budget``)."""
    try:
        if isinstance(budget, Mapping) and set(budget) == {"uniform"}:
            return
        types: dict[str, Any] = {}
        if isinstance(budget, Mapping) and set(budget) in ({"type"}, {"dense", "type"}):
            types = dict(budget)
        else:
            _, _, types["type"] = budget_key(budget)
        for key, gguf_type in types.items():
            if gguf_type is not None and gguf_type not in GGUF_TYPES:
                raise ValueError(
                    f"search.budget.{key}: unknown GGUF type {gguf_type!r}; expected one of {', '.join(GGUF_TYPES)}"
                )
    except ValueError as exc:
        raise ValueError(rekey(str(exc), where.removeprefix("selections."))) from None
