"""The specs of the tables (Tables 1-4 and the config's extra tables) and the result files each
reads; a spec is what ``coec report --kind table|table4`` turns into results/<table>.csv."""

from __future__ import annotations

import json
import os
from typing import Any

from coec.evaluate.tasks import PAPER_TASKS
from coec.io import paths
from coec.io.paths import cell_dir, fmt_ratio
from coec.select.rounding import DEFAULT_ROUNDING
from coec.workflow.targets.sources import model_path

Config = dict[str, Any]
#: the per-cell result file of the paper's tables (others: by their metric)
TABLE_FILES = {"table1": "ppl.json", "table2": "zeroshot.json", "table3": "ppl.json"}
#: the metrics of ppl.json a table can show (``kl``: the mean token KL to the dense model, docs/kl.md)
PPL_METRICS = ("ppl", "kl")

#: the line a zero-shot table's caption gets: what its ± are
ZEROSHOT_NOISE = (
    "± is one standard error: of a cell's mean over its tasks, the tasks' own "
    "standard errors combined as independent (sqrt(sum SE_t^2) / T); of Δ, the paired "
    "difference to the row named under 'vs' (same ratio) over the documents both "
    "scored, in points"
)


def table_names(config: Config) -> list[str]:
    """The generic table rule's tables the config defines: table1-3, then its extra tables."""
    return [t for t in ("table1", "table2", "table3") if t in config] + list(config.get("extra_tables") or {})


def table_cfg(config: Config, name: str) -> dict[str, Any]:
    """A table's config; table2 defaults to table1's cells scored by zero-shot mean7."""
    if name in config:
        return dict(config[name])
    if name == "table2":
        return dict(config["table1"], metric="mean7")
    return dict(config["extra_tables"][name])


def table_file(config: Config, name: str) -> str:
    """The per-cell result file a table reads: ppl.json (metric ppl or kl) or zeroshot.json."""
    if name in TABLE_FILES:
        return TABLE_FILES[name]
    return "ppl.json" if table_cfg(config, name)["metric"] in PPL_METRICS else "zeroshot.json"


def table_spec(config: Config, name: str, filename: str) -> dict[str, Any]:
    """The report spec of a table: a dense row, then one row per (ratio, selection, comp); a
    zero-shot table's rows also name the row each is compared with (``with_comparisons``)."""
    t = table_cfg(config, name)
    models = t["models"]
    rows: list[dict[str, Any]] = [
        {
            "labels": {"ratio": 0.0, "selection": "dense", "compensation": "dense"},
            "cells": {m: f"{paths.dense_dir(m)}/{filename}" for m in models},
        }
    ]
    groups: list[Any] = [None]
    for r in t["ratios"]:
        for row in t["rows"]:
            cells = {
                m: f"{cell_dir(m, t['calibration'], row['selection'], r, row['compensation'])}/{filename}"
                for m in models
            }
            labels = {
                "ratio": float(r),
                "selection": row["selection"],
                "compensation": row.get("label", row["compensation"]),
            }
            rows.append({"labels": labels, "cells": cells})
            groups.append(((float(r), row["selection"]), row["compensation"], row.get("compare")))
    metric = t["metric"]
    spec = {
        "metric": metric,
        "digits": 2 if metric == "ppl" else 4,
        "models": models,
        "label_columns": ["ratio", "selection", "compensation"],
        "rows": rows,
        "caption": f"{name}: {metric} | calibration {t['calibration']} "
        f"{json.dumps(config['calibration'][t['calibration']])} | evaluation "
        f"{json.dumps(config['evaluation'], sort_keys=True)}",
    }
    if t.get("columns"):  # only a table that asks for them: the others' specs stay as they were
        if filename != "ppl.json":
            raise ValueError(
                f"config: {name}.columns: {', '.join(t['columns'])} need a perplexity table (metric ppl or kl)"
            )
        spec["columns"] = list(t["columns"])
    return with_comparisons(config, spec, groups, f"{name}.rows")


def zeroshot_tasks(metric: str) -> list[str] | None:
    """The tasks a zero-shot table metric averages: the paper's seven for ``mean7``, one task for
    ``tasks.<task>.value``; None for a metric that is not zero-shot accuracy (perplexity)."""
    if metric == "mean7":
        return list(PAPER_TASKS)
    parts = metric.split(".")
    if len(parts) == 3 and parts[0] == "tasks" and parts[2] == "value":
        return [parts[1]]
    return None


def _compare_rows(spec: dict[str, Any], groups: list[Any], where: str) -> None:
    """Set each row's ``compare``: the index of the row of its group named by its ``compare``
    setting, by default the group's first row (compared with nothing); None for the dense row."""
    first: dict[Any, int] = {}
    named: dict[Any, int] = {}
    for i, g in enumerate(groups):
        if g is not None:
            first.setdefault(g[0], i)
            named.setdefault((g[0], g[1]), i)
    for i, (row, g) in enumerate(zip(spec["rows"], groups, strict=False)):
        if g is None:
            row["compare"] = None
            continue
        key, _, compare = g
        if compare is not None and (key, compare) not in named:
            raise ValueError(
                f"config: {where}: compare {compare!r} names no row of the same ratio and "
                f"selection (known: {', '.join(n for k, n in named if k == key)})"
            )
        ref = named[(key, compare)] if compare is not None else first[key]
        row["compare"] = ref if ref != i else None


def with_comparisons(config: Config, spec: dict[str, Any], groups: list[Any], where: str) -> dict[str, Any]:
    """A zero-shot table spec with its noise: each row's ``compare`` (the index of the row it is
    compared with, or None) and, when per-sample records are kept
    (``evaluation.zeroshot_log_samples``), the records of each cell (``samples``), which the
    report pairs document by document. ``groups[i]`` is None for the dense row, else (group key,
    row name, its ``compare`` setting). A spec of a perplexity table is returned unchanged."""
    tasks = zeroshot_tasks(spec["metric"])
    if tasks is None:
        return spec
    _compare_rows(spec, groups, where)
    paired = {i for i, row in enumerate(spec["rows"]) if row["compare"] is not None}
    paired |= {spec["rows"][i]["compare"] for i in paired}
    # records exist for the configured tasks only; a metric over others has no value to pair
    recorded = config["evaluation"]["zeroshot_log_samples"] and set(tasks) <= set(
        config["evaluation"].get("zeroshot_tasks") or []
    )
    if recorded:
        for i in sorted(paired):  # the rows a paired difference reads, document by document
            spec["rows"][i]["samples"] = {
                m: [f"{os.path.dirname(p)}/zeroshot_samples/{t}.jsonl" for t in tasks]
                for m, p in spec["rows"][i]["cells"].items()
            }
    spec.update(zeroshot_tasks=tasks, paired=bool(recorded), caption=f"{spec['caption']}\n\n{ZEROSHOT_NOISE}")
    return spec


def spec_inputs(spec: dict[str, Any]) -> list[str]:
    """Every result file a table spec reads (a zero-shot table's per-sample records too)."""
    files = {p for row in spec["rows"] for p in row["cells"].values()}
    files |= {p for row in spec["rows"] for ps in row.get("samples", {}).values() for p in ps}
    return sorted(files)


def table_inputs(config: Config, name: str) -> list[str]:
    """Every result file a table reads."""
    return spec_inputs(table_spec(config, name, table_file(config, name)))


def table4_spec(config: Config) -> dict[str, Any]:
    """The spec of Table 4 (deployment cost of the published architectures and local models) at
    ``table4.group_rounding`` (its own key: the paper's ceil, whatever the cells' rounding)."""
    t = config["table4"]
    rounding = t.get("group_rounding", DEFAULT_ROUNDING)
    return {
        "ratio": t["ratio"],
        "group_rounding": rounding,
        "published": t.get("published", []),
        "local": {m: str(model_path(config, m)) for m in t.get("models", [])},
        "caption": f"Table 4: deployment cost at {fmt_ratio(t['ratio'])} "
        f"column sparsity ({rounding} rounding of KV groups and channels); params in 1e9, "
        "memory in GiB (bf16 weights + KV cache + one layer's activations at 4096 "
        "tokens), GFLOPs per token = 2 x params",
    }


def table4_inputs(config: Config) -> list[str]:
    """The converted folders of Table 4's embedded models (the others need no workflow output)."""
    return [
        paths.model_dir(m) for m in config["table4"].get("models", []) if config["models"][m]["source"] == "embedded"
    ]
