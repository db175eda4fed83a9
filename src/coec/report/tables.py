"""Tables (CSV + Markdown twin) assembled from per-cell JSON results.

A table spec (built by the Snakefile from the config) is::

    {"metric": "ppl" | "kl" | "mean7" | <key>, "digits": 2, "caption": "...",
     "label_columns": ["ratio", "selection", "compensation"],
     "models": ["smollm2-135m", ...],
     "rows": [{"labels": {"ratio": 0.3, ...}, "cells": {"smollm2-135m": "results/.../ppl.json"}}]}

and, only when the table asks for them, ``"columns": ["kl"]``: a column ``<model> kl`` beside each
model's (``coec.report.columns.METRIC_COLUMNS``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd

from coec.evaluate.geometry import summarize_geometry
from coec.evaluate.paired import paired_difference, per_document
from coec.io import artifacts, atomic
from coec.model.arch import MODULES
from coec.report.claims.report import write_claims
from coec.report.columns import METRIC_COLUMNS, NOISE_COLUMNS
from coec.report.cost import PUBLISHED_ARCHS, cost_table
from coec.report.frontier import write_frontier
from coec.report.measured.table import write_measured
from coec.report.rendering import save_figure, set_caption, to_markdown
from coec.report.sota import write_sota
from coec.select.rounding import DEFAULT_ROUNDING

Spec = dict[str, Any]

DISPLAY = {
    "wanda_sp": "Wanda-sp",
    "flap": "FLAP",
    "rcpu": "RCPU",
    "dense": "dense",
    "none": "–",
    "bias": "bias",
    "coec": "COEC",
    "lstsq": "lstsq",
}
FIGURE_DISPLAY = dict(DISPLAY, none="prune-only", lstsq="ridge (lstsq)")  # a legend needs a word, not a dash


def metric_value(path: str | Path, metric: str) -> float:
    """The metric of one cell's JSON file (nested keys with dots, e.g. 'tasks.arc_easy.value');
    the file is checked by ``artifacts.read_result`` (format version, parse errors name it)."""
    obj: Any = artifacts.read_result(path)
    for part in metric.split("."):
        if not isinstance(obj, dict) or part not in obj:
            return math.nan
        obj = obj[part]
    return float(obj) if obj is not None else math.nan


def _labels(row: dict[str, Any]) -> dict[str, Any]:
    """A table row's label columns as shown (display names; numbers as ``{v:g}``)."""
    return {k: DISPLAY.get(v, v) if isinstance(v, str) else f"{v:g}" for k, v in row["labels"].items()}


def build_table(spec: Spec) -> pd.DataFrame:
    """One row per spec row: its label columns, then the metric per model column (a zero-shot
    table's also its noise: ``zeroshot_table``)."""
    if spec.get("zeroshot_tasks"):
        return zeroshot_table(spec)
    extra = spec.get("columns", [])
    records = []
    for row in spec["rows"]:
        rec = _labels(row)
        for model in spec["models"]:
            path = row["cells"].get(model)
            rec[model] = metric_value(path, spec["metric"]) if path else math.nan
            for c in extra:
                rec[f"{model} {c}"] = metric_value(path, METRIC_COLUMNS[c][0]) if path else math.nan
        records.append(rec)
    columns = [c for m in spec["models"] for c in [m, *(f"{m} {x}" for x in extra)]]
    return pd.DataFrame.from_records(records, columns=spec["label_columns"] + columns)


def cell_stderr(path: str | Path, tasks: list[str]) -> float:
    """Standard error of a zero-shot cell's mean over ``tasks``: its tasks' standard errors
    (lm-eval's, in ``zeroshot.json``) combined as independent, ``sqrt(sum SE_t^2) / T``."""
    obj = artifacts.read_result(path)
    try:
        ses = [float(obj["tasks"][t]["stderr"]) for t in tasks]
    except (KeyError, TypeError):
        return math.nan
    return math.sqrt(sum(se * se for se in ses)) / len(ses)


def paired_noise(path_a: str | Path, path_b: str | Path, tasks: list[str]) -> tuple[float, float]:
    """(difference, paired standard error) of two zero-shot cells' means over ``tasks``, from
    their per-sample records, document by document (``evaluate.paired``); NaNs without them."""
    try:
        a = {t: per_document(Path(path_a).parent, t) for t in tasks}
        b = {t: per_document(Path(path_b).parent, t) for t in tasks}
    except FileNotFoundError:
        return math.nan, math.nan
    res = paired_difference(a, b)
    return res["diff"], res["se"]


def zeroshot_table(spec: Spec) -> pd.DataFrame:
    """A zero-shot table with its noise (``targets.with_comparisons``): per model the metric,
    its standard error (``<model> se``), and for a row compared with another (label column
    ``vs``) the difference and its paired standard error (``<model> diff``, ``<model> diff se``),
    as fractions like the metric."""
    tasks = spec["zeroshot_tasks"]
    rows = spec["rows"]
    cols = list(spec["label_columns"]) + ["vs"]
    for m in spec["models"]:
        cols += [m] + [m + suffix for suffix in NOISE_COLUMNS]
    records = []
    for row in rows:
        rec = _labels(row)
        ref = rows[row["compare"]] if row.get("compare") is not None else None
        vs = ref["labels"].get("compensation", ref["labels"].get("method")) if ref else ""
        rec["vs"] = DISPLAY.get(vs, vs)
        for m in spec["models"]:
            path = row["cells"].get(m)
            rec[m] = metric_value(path, spec["metric"]) if path else math.nan
            rec[f"{m} se"] = cell_stderr(path, tasks) if path else math.nan
            rec[f"{m} diff"] = rec[f"{m} diff se"] = math.nan
            if ref is not None and path and ref["cells"].get(m):
                if spec.get("paired", True):
                    rec[f"{m} diff"], rec[f"{m} diff se"] = paired_noise(path, ref["cells"][m], tasks)
                else:  # no per-sample records: the difference alone
                    rec[f"{m} diff"] = rec[m] - metric_value(ref["cells"][m], spec["metric"])
        records.append(rec)
    return pd.DataFrame.from_records(records, columns=cols)


def zeroshot_display(df: pd.DataFrame, spec: Spec) -> pd.DataFrame:
    """The Markdown face of ``zeroshot_table``: per model ``44.30 ± 2.61`` and, where compared,
    ``+1.20 ± 0.80`` (points)."""

    def pm(v: float, se: float, sign: bool = False) -> str:
        if isinstance(v, float) and math.isnan(v):
            return "–" if not sign else ""
        text = f"{100 * v:+.2f}" if sign else f"{100 * v:.2f}"
        return text if math.isnan(se) else f"{text} ± {100 * se:.2f}"

    out = df[list(spec["label_columns"]) + ["vs"]].copy()
    for m in spec["models"]:
        out[m] = [pm(v, se) for v, se in zip(df[m], df[f"{m} se"], strict=True)]
        out[f"{m} Δ"] = [pm(v, se, sign=True) for v, se in zip(df[f"{m} diff"], df[f"{m} diff se"], strict=True)]
    return out


def write_table(
    df: pd.DataFrame, out: str | Path, digits: int = 2, caption: str = "", column_digits: dict[str, int] | None = None
) -> None:
    """``out`` (CSV) and its Markdown twin (same stem, .md; ``column_digits``: ``to_markdown``'s)."""
    out = Path(out)
    artifacts.write_csv(out, df, float_format="%.4f")
    atomic.write_text(out.with_suffix(".md"), to_markdown(df, digits, caption, column_digits))


def appc_summary(spec: Spec) -> pd.DataFrame:
    """App. C summary (one row per key) from a cell's geometry.csv."""
    rows = artifacts.read_csv_rows(spec["geometry"], artifacts.GEOMETRY_COLUMNS)
    summary = summarize_geometry(rows)
    return pd.DataFrame({"quantity": list(summary), "value": [float(v) for v in summary.values()]})


def table4(spec: Spec) -> pd.DataFrame:
    """Deployment cost (Table 4) of the named architectures at ``ratio``: published configs
    (``coec.report.cost.PUBLISHED_ARCHS``) and local model folders (their config.json)."""
    archs: dict[str, Any] = {}
    for name in spec.get("published", []):
        if name not in PUBLISHED_ARCHS:
            raise ValueError(f"unknown published architecture {name!r}; known: {', '.join(PUBLISHED_ARCHS)}")
        archs[name] = PUBLISHED_ARCHS[name]
    for name, folder in spec.get("local", {}).items():
        archs[name] = artifacts.read_json(Path(folder) / "config.json")
    rows = cost_table(archs, spec["ratio"], spec.get("group_rounding", DEFAULT_ROUNDING))
    return pd.DataFrame(rows)


def plot_geometry(spec: Spec, out: str | Path) -> None:
    """Principal angles O–P and O–C per layer, one panel per module (App. C)."""
    # deferred: matplotlib (~0.6 s) serves only the figure kinds; pyplot needs the Agg backend first
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    df = pd.DataFrame(artifacts.read_csv_rows(spec["geometry"], artifacts.GEOMETRY_COLUMNS))
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8), sharey=True)
    for ax, module in zip(axes, MODULES, strict=True):
        d = df[df.module == module]
        r = int(d["r"].iloc[0]) if len(d) else 0
        ax.plot(d.layer, d.angle_OP_mean, "o-", label="O–P (pruning)")
        ax.plot(d.layer, d.angle_OC_mean, "s-", label="O–C (after compensation)")
        ax.set_title(f"{module} (top-{r} frames)")
        ax.set_xlabel("layer")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # layer indices, not 0.2 steps
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("mean principal angle (degrees)")
    axes[0].legend()
    set_caption(fig, spec.get("caption", "App. C: read-frame rotation by pruning and compensation"))
    save_figure(fig, out)


def plot_lines(spec: Spec, out: str | Path) -> None:
    """A metric against an x value, one line per series, one panel per group (Fig. 2 style).

    spec: {"xlabel", "ylabel", "caption", "logx", "logy", "panels": {title: {series: [[x, path],
    ...]}}, "metric"}. logy: log-scaled y (perplexities of pruned-only and compensated cells differ
    by an order of magnitude)."""
    # deferred: matplotlib (~0.6 s) serves only the figure kinds; pyplot needs the Agg backend first
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    panels = spec["panels"]
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.8), squeeze=False)
    for ax, (title, series) in zip(axes[0], panels.items(), strict=True):
        all_y = []
        for name, points in series.items():
            xs = [x for x, _ in points]
            ys = [metric_value(p, spec.get("metric", "ppl")) for _, p in points]
            all_y += ys
            ax.plot(xs, ys, "o-", label=FIGURE_DISPLAY.get(name, name))
        ax.set_title(title)
        ax.set_xlabel(spec.get("xlabel", ""))
        if spec.get("logx"):
            ax.set_xscale("log", base=2)
            ax.set_xticks(xs, [str(x) for x in xs])
        if spec.get("logy") and max(all_y) > 3 * min(all_y):  # narrow panels stay linear
            ax.set_yscale("log")
            ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
            ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
            ax.yaxis.set_minor_formatter(NullFormatter())
        ax.grid(alpha=0.3, which="both")
    axes[0][0].set_ylabel(spec.get("ylabel", ""))
    axes[0][0].legend()
    set_caption(fig, spec.get("caption", ""))
    save_figure(fig, out)


def browsable_report(spec: Spec) -> str:
    """results/README.md: every listed table (its Markdown twin, caption included) and figure
    (embedded as an image with its caption), with the config that produced them."""
    lines = [
        "# Results",
        "",
        f"Config: `{spec.get('configfiles', 'config.yaml')}`. "
        "Each table's caption names its calibration set and evaluation protocol.",
        "",
    ]
    for item in spec["items"]:
        path = Path(item["path"])
        lines += [f"## {item.get('title', path.stem)}", ""]
        if path.suffix == ".png":
            lines += [
                f"![{item.get('caption', path.stem)}]({path.relative_to('results')})",
                "",
                item.get("caption", ""),
                "",
            ]
        else:
            md = path.with_suffix(".md")
            lines += [md.read_text().strip() if md.is_file() else f"(missing: {md})", "", f"CSV: `{path}`", ""]
    return "\n".join(lines) + "\n"


def _write_zeroshot_or_table(spec: Spec, out: str | Path) -> pd.DataFrame:
    df = build_table(spec)
    if spec.get("zeroshot_tasks"):
        out = Path(out)
        artifacts.write_csv(out, df, float_format="%.4f")
        atomic.write_text(
            out.with_suffix(".md"), to_markdown(zeroshot_display(df, spec), caption=spec.get("caption", ""))
        )
        return df
    places = {f"{m} {c}": METRIC_COLUMNS[c][1] for m in spec["models"] for c in spec.get("columns", [])}
    write_table(df, out, spec.get("digits", 2), spec.get("caption", ""), places)
    return df


def _table_writer(build: Callable[[Spec], pd.DataFrame], digits: int) -> Callable[[Spec, str | Path], pd.DataFrame]:
    """The writer of the table ``build`` makes of a spec (:func:`write_table`, ``digits`` places)."""

    def write(spec: Spec, out: str | Path) -> pd.DataFrame:
        df = build(spec)
        write_table(df, out, digits, spec.get("caption", ""))
        return df

    return write


def _write_readme(spec: Spec, out: str | Path) -> str:
    text = browsable_report(spec)
    atomic.write_text(out, text)
    return text


#: kind -> writer(spec, out); the writers return what they wrote (a table, text) or None.
WRITERS: dict[str, Callable[[Spec, str | Path], Any]] = {
    "table": _write_zeroshot_or_table,
    "appc": _table_writer(appc_summary, 3),
    "table4": _table_writer(table4, 2),
    "table4-measured": write_measured,  # measured deployment cost (coec.report.measured.table)
    "frontier": write_frontier,  # pruned or quantized (coec.report.frontier)
    "sota": write_sota,  # the state of the art at one budget (coec.report.sota)
    "geometry-figure": plot_geometry,
    "lines-figure": plot_lines,
    "claims": write_claims,
    "readme": _write_readme,
}


def write_report(kind: str, spec: Spec, out: str | Path) -> Any:
    """Dispatch: table (CSV + .md), appc (CSV + .md), table4 (CSV + .md), geometry-figure and
    lines-figure (PNG)."""
    if kind not in WRITERS:
        raise ValueError(
            f"unknown report kind {kind!r}; expected table, appc, table4, table4-measured, frontier, sota, "
            "geometry-figure, lines-figure, claims or readme"
        )
    return WRITERS[kind](spec, out)
