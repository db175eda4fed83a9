"""The claims report's building blocks: :class:`Results` (lazy readers of the result files a
claims spec names), the verdict helpers, :class:`Claim` and the registry ``CLAIMS`` (see the
package docstring)."""

from __future__ import annotations

import csv
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from coec.io.artifacts import read_result
from coec.registry import Registry
from coec.report.columns import is_model_column

T = TypeVar("T")
#: model -> (base value, new value)
Pairs = dict[str, tuple[float, float]]
#: a claim's check result: (the figure measured here, the verdict)
Verdict = tuple[str, str]
Better = Callable[[float, float], bool]
Rule = Callable[[Pairs, Better], Verdict]
Check = Callable[["Results"], Verdict]

VERDICTS = ("holds", "does not hold", "not testable here")


class NotTestable(Exception):
    """The config or the results lack what a claim needs (the message says what)."""


# --------------------------------------------------------------------------- reading results
def as_float(v: str | float | None) -> float:
    try:
        return float(v) if v is not None else math.nan
    except (TypeError, ValueError):
        return math.nan


def _csv(path: str | Path) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def _long(paths: Iterable[str | Path] | None, label_columns: tuple[str, ...]) -> list[dict[str, Any]]:
    """Tables (label columns, then one column per model; a zero-shot table's noise columns
    are skipped) as long rows: labels, model, value."""
    out = []
    for p in paths or []:
        for row in _csv(p):
            labels = {k: row.get(k, "") for k in label_columns}
            for key, val in row.items():
                if is_model_column(key, label_columns):
                    out.append({**labels, "model": key, "value": as_float(val)})
    return out


def _ppl(path: str | Path) -> float:
    return as_float(read_result(path).get("ppl"))


class Results:
    """Lazy, cached readers of the result files named by a claims spec."""

    def __init__(self, spec: dict[str, Any]):
        self.spec = spec
        self._cache: dict[str, Any] = {}

    def _get(self, key: str, make: Callable[[], T]) -> T:
        if key not in self._cache:
            self._cache[key] = make()
        value: T = self._cache[key]
        return value

    def need(self, key: str, what: str) -> Any:
        if not self.spec.get(key):
            raise NotTestable(f"the config defines no {what}")
        return self.spec[key]

    def cells(self, metric: str) -> list[dict[str, Any]]:
        """Long rows (ratio, selection, compensation, model, value) of every ppl / zero-shot table."""
        key = "ppl_tables" if metric == "ppl" else "zeroshot_tables"
        paths = self.need(key, "perplexity tables" if metric == "ppl" else "zero-shot tables")
        rows = self._get(key, lambda: _long(paths, ("ratio", "selection", "compensation")))
        return rows

    def pairs(self, metric: str, ratio: float, selection: str, base: str, new: str) -> Pairs:
        """model -> (base value, new value) of two compensations under one selection and ratio."""
        found: dict[str, dict[str, float]] = {}
        for r in self.cells(metric):
            if (
                math.isclose(as_float(r["ratio"]), ratio)
                and r["selection"] == selection
                and r["compensation"] in (base, new)
                and math.isfinite(r["value"])
            ):
                found.setdefault(r["model"], {})[r["compensation"]] = r["value"]
        out = {m: (v[base], v[new]) for m, v in found.items() if base in v and new in v}
        if not out:
            raise NotTestable(
                f"no {selection} rows with {base} and {new} at {ratio:g} in the "
                f"{'perplexity' if metric == 'ppl' else 'zero-shot'} tables"
            )
        return out

    def table3(self) -> dict[str, dict[str, float]]:
        """compensation name -> model -> ppl of the ablation ladder."""
        path = self.need("table3", "table3 (ablation ladder)")
        names = self.spec.get("table3_rows") or []

        def make() -> dict[str, dict[str, float]]:
            rows = [r for r in _csv(path) if r.get("selection") != "dense"]
            out = {}
            for name, row in zip(names, rows, strict=False):
                out[name] = {k: as_float(v) for k, v in row.items() if k not in ("ratio", "selection", "compensation")}
            return out

        return self._get("table3", make)

    def table4(self) -> list[dict[str, Any]]:
        path = self.need("table4", "table4 (deployment cost)")
        return self._get(
            "table4", lambda: [{k: (v if k == "model" else as_float(v)) for k, v in r.items()} for r in _csv(path)]
        )

    def appc(self) -> dict[str, float]:
        path = self.need("appC", "appC (geometry)")
        return self._get("appC", lambda: {r["quantity"]: as_float(r["value"]) for r in _csv(path)})

    def table(self, key: str, what: str, label_columns: tuple[str, ...]) -> list[dict[str, Any]]:
        """Long rows (labels, model, value) of the table the spec names under ``key``."""
        path = self.need(key, what)
        return self._get(key, lambda: _long([path], label_columns))

    def curves(self, key: str, what: str) -> dict[str, dict[str, list[tuple[int, float]]]]:
        """panel -> line -> [(N, ppl)] of a calibration-size figure spec."""
        panels = self.need(key, what)
        return self._get(
            key,
            lambda: {
                p: {c: [(int(n), _ppl(f)) for n, f in pts] for c, pts in lines.items()} for p, lines in panels.items()
            },
        )


# --------------------------------------------------------------------------- helpers
def fmt(v: float) -> str:
    return "n/a" if not math.isfinite(v) else f"{v:.4g}"


def count_better(pairs: Pairs, better: Better) -> tuple[int, str]:
    wins = sum(better(b, n) for b, n in pairs.values())
    detail = "; ".join(f"{m}: {fmt(b)} → {fmt(n)}" for m, (b, n) in sorted(pairs.items()))
    return wins, f"{wins}/{len(pairs)} models ({detail})"


def lower(b: float, n: float) -> bool:
    return n < b


def not_lower(b: float, n: float) -> bool:  # accuracy matched or improved
    return n >= b


def every(pairs: Pairs, better: Better) -> Verdict:
    wins, text = count_better(pairs, better)
    return text, "holds" if wins == len(pairs) else "does not hold"


def most(pairs: Pairs, better: Better) -> Verdict:
    wins, text = count_better(pairs, better)
    return text, "holds" if wins > len(pairs) / 2 else "does not hold"


def selection_label(name: str) -> str:
    return {"wanda_sp": "Wanda-sp", "flap": "FLAP", "rcpu": "RCPU"}[name]


def pair_claim(metric: str, ratio: float, selection: str, base: str, new: str, rule: Rule) -> Check:
    def check(res: Results) -> Verdict:
        return rule(
            res.pairs(metric, ratio, selection_label(selection), base, new), lower if metric == "ppl" else not_lower
        )

    return check


def never(reason: str) -> Check:
    def check(res: Results) -> Verdict:
        raise NotTestable(reason)

    return check


def all_hold(*results: Verdict) -> Verdict:
    text = "; ".join(t for t, _ in results)
    return text, "holds" if all(v == "holds" for _, v in results) else "does not hold"


@dataclass(frozen=True)
class Claim:
    """One claim: ``id`` (its name in the registry), the paper, its section, the claim in one
    line, the paper's own figure, and the check."""

    id: str
    paper: str
    section: str
    claim: str
    paper_figure: str
    check: Check

    @property
    def name(self) -> str:
        return self.id


#: Every claim, by id, in report order.
CLAIMS: Registry[Claim] = Registry("claim")
