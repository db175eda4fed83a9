"""The state-of-the-art table (results/table_sota.csv + .md, docs/sota.md): selections and
per-layer allocations at one budget, each with the compensations the config names, side by side.

One row per (model, row of the config) and a dense row per model. Columns: ``prunable`` (the
prunable parameters the cell keeps, from its keep.json: the q/k/v/o rows and columns of the kept
KV groups and the gate/up/down of the kept channels, ``coec.select.search.budget.layer_params_at``),
``pruned %`` (of the dense model's prunable parameters), ``Δ %`` (kept prunable parameters against
the first row's: the budget every row must meet within ``tolerance``), ``params`` (the evaluated
model's parameter count, ppl.json), ``ppl``, ``kl`` (mean token KL to the dense model, ppl.json),
``mean7`` and ``mean7 se`` (zero-shot mean over the paper's seven tasks and its standard error).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pandas as pd

from coec.io import artifacts, atomic
from coec.report.cost import arch_dims, config_dict
from coec.report.rendering import to_markdown
from coec.select.search.budget import layer_params_at

log = logging.getLogger(__name__)

Spec = dict[str, Any]
COLUMNS = [
    "model",
    "selection",
    "compensation",
    "label",
    "prunable",
    "pruned %",
    "Δ %",
    "params",
    "ppl",
    "kl",
    "mean7",
    "mean7 se",
]
#: Markdown digits per column (others: as they are)
DIGITS = {"params": 0, "pruned %": 2, "Δ %": 2, "ppl": 2, "kl": 4, "mean7": 4, "mean7 se": 4}


def model_dims(path: str) -> dict[str, Any]:
    """``arch_dims`` of a model: its folder's config.json, else (a hub id) its transformers config."""
    local = Path(path) / "config.json"
    if local.is_file():
        return arch_dims(artifacts.read_json(local))
    from coec.model.load import load_config  # deferred: transformers, only for a hub model

    return arch_dims(config_dict(load_config(path)))


def kept_prunable(d: Mapping[str, Any], keep: Mapping[str, Any]) -> int:
    """Prunable parameters a keep set keeps: per layer, its kept KV groups (with their query
    heads) and MLP channels (``layer_params_at``; a removed block keeps none)."""
    return sum(sum(layer_params_at(d, len(layer["kv_groups"]), len(layer["channels"]))) for layer in keep["layers"])


def dense_prunable(d: Mapping[str, Any]) -> int:
    """Prunable parameters of the dense model: every layer at full width."""
    return int(d["layers"]) * sum(layer_params_at(d, int(d["kv_heads"]), int(d["ffn"])))


def _value(obj: Mapping[str, Any], key: str) -> float:
    v = obj.get(key)
    return float(v) if v is not None else math.nan


def zeroshot_mean(path: str, tasks: list[str]) -> tuple[float, float]:
    """(mean accuracy over ``tasks``, its standard error ``sqrt(sum SE_t^2) / T``) of a zeroshot.json."""
    res = artifacts.read_result(path)["tasks"]
    missing = [t for t in tasks if t not in res]
    if missing:
        raise ValueError(f"{path}: no result for task(s) {', '.join(missing)} (has {', '.join(res)})")
    mean = sum(float(res[t]["value"]) for t in tasks) / len(tasks)
    se = math.sqrt(sum(float(res[t]["stderr"]) ** 2 for t in tasks)) / len(tasks)
    return mean, se


def _metrics(cell: Mapping[str, str], tasks: list[str]) -> dict[str, float]:
    ppl = artifacts.read_result(cell["ppl"])
    mean, se = zeroshot_mean(cell["zeroshot"], tasks)
    return {
        "params": _value(ppl, "params"),
        "ppl": _value(ppl, "ppl"),
        "kl": _value(ppl, "kl"),
        "mean7": mean,
        "mean7 se": se,
    }


def sota_table(spec: Spec) -> pd.DataFrame:
    """The table's rows (module docstring): per model its dense row, then the config's rows."""
    records = []
    for m in spec["models"]:
        d = model_dims(spec["model_paths"][m])
        full = dense_prunable(d)
        records.append(
            {
                "model": m,
                "selection": "dense",
                "compensation": "dense",
                "label": "",
                "prunable": full,
                "pruned %": 0.0,
                "Δ %": math.nan,
                **_metrics(spec["dense"][m], spec["tasks"]),
            }
        )
        ref = None
        for row in spec["rows"]:
            cell = row["cells"][m]
            kept = kept_prunable(d, artifacts.read_json(cell["keep"]))
            ref = kept if ref is None else ref
            delta = 100.0 * (kept - ref) / ref
            if abs(delta) > 100.0 * spec["tolerance"]:
                log.warning(
                    "%s %s/%s keeps %d prunable parameters, %.2f %% off the first row's %d (tolerance %g %%)",
                    m,
                    row["selection"],
                    row["compensation"],
                    kept,
                    delta,
                    ref,
                    100 * spec["tolerance"],
                )
            records.append(
                {
                    "model": m,
                    "selection": row["selection"],
                    "compensation": row["compensation"],
                    "label": row["label"],
                    "prunable": kept,
                    "pruned %": 100.0 * (1 - kept / full),
                    "Δ %": delta,
                    **_metrics(cell, spec["tasks"]),
                }
            )
    return pd.DataFrame.from_records(records, columns=COLUMNS)


def write_sota(spec: Spec, out: str | Path) -> pd.DataFrame:
    """``out`` (CSV) and its Markdown twin (same stem, .md) with the spec's caption."""
    df = sota_table(spec)
    out = Path(out)
    artifacts.write_csv(out, df, float_format="%.6g")
    shown = df.copy()
    for col, digits in DIGITS.items():
        shown[col] = [("–" if math.isnan(v) else f"{v:.{digits}f}") for v in shown[col]]
    atomic.write_text(out.with_suffix(".md"), to_markdown(shown, caption=spec.get("caption", "")))
    return df
