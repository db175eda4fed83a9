"""Tables (CSV + Markdown twin) assembled from per-cell JSON results.

A table spec (built by the Snakefile from the config) is::

    {"metric": "ppl" | "mean7" | <key>, "digits": 2, "caption": "...",
     "label_columns": ["ratio", "selection", "compensation"],
     "models": ["smollm2-135m", ...],
     "rows": [{"labels": {"ratio": 0.3, ...}, "cells": {"smollm2-135m": "results/.../ppl.json"}}]}
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd

from .data import atomic_write_text

DISPLAY = {"wanda_sp": "Wanda-sp", "flap": "FLAP", "rcpu": "RCPU", "dense": "dense",
           "none": "–", "bias": "bias", "coec": "COEC", "lstsq": "lstsq"}


def metric_value(path: str | Path, metric: str) -> float:
    """The metric of one cell's JSON file (nested keys with dots, e.g. 'tasks.arc_easy.value')."""
    obj = json.loads(Path(path).read_text())
    for part in metric.split("."):
        if not isinstance(obj, dict) or part not in obj:
            return math.nan
        obj = obj[part]
    return float(obj) if obj is not None else math.nan


def build_table(spec: dict) -> pd.DataFrame:
    """One row per spec row: its label columns, then the metric per model column."""
    records = []
    for row in spec["rows"]:
        rec = {k: DISPLAY.get(v, v) if isinstance(v, str) else v for k, v in row["labels"].items()}
        for model in spec["models"]:
            path = row["cells"].get(model)
            rec[model] = metric_value(path, spec["metric"]) if path else math.nan
        records.append(rec)
    return pd.DataFrame.from_records(records, columns=spec["label_columns"] + spec["models"])


def to_markdown(df: pd.DataFrame, digits: int = 2, caption: str = "") -> str:
    """A GitHub Markdown table (no extra dependency), numbers rounded to ``digits``."""
    def fmt(v):
        if isinstance(v, float):
            return "–" if math.isnan(v) else f"{v:.{digits}f}"
        return str(v)

    head = "| " + " | ".join(df.columns) + " |"
    sep = "|" + "|".join("---" for _ in df.columns) + "|"
    body = ["| " + " | ".join(fmt(v) for v in row) + " |" for row in df.itertuples(index=False)]
    text = "\n".join([head, sep, *body]) + "\n"
    return (f"{caption}\n\n{text}" if caption else text)


def write_report(kind: str, spec: dict, out: str | Path) -> pd.DataFrame:
    """Write ``out`` (CSV) and its Markdown twin (same stem, .md)."""
    if kind != "table":
        raise ValueError(f"unknown report kind {kind!r}; expected 'table'")
    df = build_table(spec)
    out = Path(out)
    atomic_write_text(out, df.to_csv(index=False, float_format="%.4f"))
    atomic_write_text(out.with_suffix(".md"),
                      to_markdown(df, spec.get("digits", 2), spec.get("caption", "")))
    return df
