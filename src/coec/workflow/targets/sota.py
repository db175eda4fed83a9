"""The spec of the state-of-the-art table (``table_sota``: results/table_sota.csv, docs/sota.md)
and the result files it reads: per row and model, the cell's keep.json (its realised widths),
ppl.json (perplexity, KL to the dense model, parameter count) and zeroshot.json (the paper's seven
tasks); the dense model's ppl.json and zeroshot.json for the dense row."""

from __future__ import annotations

from typing import Any

from coec.evaluate.tasks import PAPER_TASKS
from coec.io import paths
from coec.io.paths import cell_dir, fmt_ratio
from coec.workflow.targets.sources import model_path

Config = dict[str, Any]
#: the table's name: its config key and its result files' stem
NAME = "table_sota"


def sota_spec(config: Config) -> dict[str, Any]:
    """The report spec of ``table_sota`` (``coec report --kind sota``, ``coec.report.sota``)."""
    t = config[NAME]
    ratio, calib = float(t["ratio"]), t["calibration"]
    rows: list[dict[str, Any]] = []
    for row in t["rows"]:
        cells = {}
        for m in t["models"]:
            cell = cell_dir(m, calib, row["selection"], ratio, row["compensation"])
            cells[m] = {
                "ppl": f"{cell}/ppl.json",
                "zeroshot": f"{cell}/zeroshot.json",
                "keep": paths.keep_file(m, calib, row["selection"], fmt_ratio(ratio)),
            }
        rows.append(
            {
                "selection": row["selection"],
                "compensation": row["compensation"],
                "label": row.get("label", ""),
                "cells": cells,
            }
        )
    return {
        "models": list(t["models"]),
        "model_paths": {m: model_path(config, m) for m in t["models"]},
        "dense": {
            m: {"ppl": f"{paths.dense_dir(m)}/ppl.json", "zeroshot": f"{paths.dense_dir(m)}/zeroshot.json"}
            for m in t["models"]
        },
        "rows": rows,
        "ratio": ratio,
        "tolerance": float(t["tolerance"]),
        "tasks": list(PAPER_TASKS),
        "caption": f"{NAME}: the state of the art at {ratio * 100:g} % of the prunable parameters | "
        f"calibration {calib} | evaluation perplexity on {config['evaluation']['ppl_dataset']}, "
        f"zero-shot mean of {len(PAPER_TASKS)} tasks (± one standard error) | realised prunable "
        f"parameters per row, Δ to the first row's (tolerance ± {float(t['tolerance']) * 100:g} %)",
    }


def sota_inputs(config: Config) -> list[str]:
    """Every result file ``table_sota`` reads, and the converted folders of its embedded models
    (their config.json gives the prunable parameter count)."""
    spec = sota_spec(config)
    files = {p for cell in spec["dense"].values() for p in cell.values()}
    files |= {p for row in spec["rows"] for cell in row["cells"].values() for p in cell.values()}
    folders = {paths.model_dir(m) for m in spec["models"] if config["models"][m]["source"] == "embedded"}
    return sorted(files | folders)
