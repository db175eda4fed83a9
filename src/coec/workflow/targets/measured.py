"""The config key ``table4_measured`` as the measured table's spec and its input files (the rule in
workflow/rules/deploy.smk). Pure functions of the config (defaults filled by the schema).

Cells: the dense model (always, first), then each configured row: a workflow cell (``selection``,
``compensation``: its HF export ``…/{comp}/export`` and GGUF files ``…/{comp}/export-{type}.gguf``)
or an iterative cell (``variant``: GGUF files next to its keep set; transformers runs it assembled
in memory, since per-layer widths, e.g. AL-AM, have no HF class). The f16 GGUF of every cell is
always made: the FLOP bound is read from it.
"""

from __future__ import annotations

from typing import Any

from coec.config.validate import ConfigError
from coec.io import paths
from coec.iterative import targets as iterative_targets
from coec.report.measured.runtimes import RUNTIMES
from coec.workflow.targets import model_path

KEY = "table4_measured"


def _check(config: dict[str, Any]) -> dict[str, Any]:
    """The table's config, every name it uses checked (one line naming the key)."""
    t: dict[str, Any] = config[KEY]
    if t["model"] not in config["models"]:
        raise ConfigError(f"config: {KEY}.model: unknown model {t['model']!r}")
    calibs = set(config["calibration"]) | set(iterative_targets.mix_entries(config))
    for i, row in enumerate(t["cells"]):
        where = f"{KEY}.cells[{i}]"
        calib = row.get("calibration", t["calibration"])
        if calib not in calibs:
            raise ConfigError(f"config: {where}.calibration: unknown calibration set {calib!r}")
        if "variant" in row and row["variant"] not in iterative_targets.variant_entries(config):
            raise ConfigError(f"config: {where}.variant: unknown iterative variant {row['variant']!r}")
        if "compensation" in row and row["compensation"] not in config["compensations"]:
            raise ConfigError(f"config: {where}.compensation: unknown compensation {row['compensation']!r}")
    return t


def _label(row: dict[str, Any]) -> str:
    if row.get("label"):
        return str(row["label"])
    what = row.get("variant") or f"{row['selection']}+{row['compensation']}"
    return f"{what} {paths.fmt_ratio(row['ratio'])}"


def gguf_types(t: dict[str, Any]) -> list[str]:
    """The GGUF types to export: f16 (the bounds) and every llama.cpp runtime's type."""
    return list(dict.fromkeys(["f16", *(RUNTIMES[r][1] for r in t["runtimes"] if RUNTIMES[r][0] == "llama.cpp")]))


def measured_cells(config: dict[str, Any]) -> list[dict[str, Any]]:
    """The spec's cells: label, ratio, hf folder or in-memory build, GGUF files by type."""
    t = _check(config)
    model, types = t["model"], gguf_types(t)
    src = model_path(config, model)
    cells = [
        {
            "label": "dense",
            "ratio": 0.0,
            "hf": src,
            "gguf": {g: paths.gguf_file(paths.dense_dir(model), g) for g in types},
        }
    ]
    for row in t["cells"]:
        calib = row.get("calibration", t["calibration"])
        cell = {"label": _label(row), "ratio": row["ratio"]}
        if "variant" in row:
            base = iterative_targets.cell_dir(model, calib, row["variant"], row["ratio"])
            last = config["models"][model]["num_layers"] - 1
            cell["build"] = {"model": src, "keep": f"{base}/keep.json", "comp": [paths.block_file(base, 0, last)]}
        else:
            base = paths.cell_dir(model, calib, row["selection"], row["ratio"], row["compensation"])
            cell["hf"] = paths.export_dir(base)
        cell["gguf"] = {g: paths.gguf_file(base, g) for g in types}
        cells.append(cell)
    return cells


def measured_spec(config: dict[str, Any]) -> dict[str, Any]:
    """The spec of ``coec report --kind table4-measured`` (coec.report.measured.table)."""
    t = _check(config)
    keys = ("runtimes", "prompt_tokens", "new_tokens", "repeats", "threads", "seed")
    return {
        **{k: t[k] for k in keys},
        "cells": measured_cells(config),
        "device": "cpu",
        "figure": paths.figure_file(KEY),
        "caption": f"Table 4, measured: {t['model']} dense and pruned, as exported (HF "
        "checkpoints; GGUF files of coec export --format gguf), on this machine's CPU.",
    }


def measured_inputs(config: dict[str, Any]) -> list[str]:
    """Every file the measured table reads: the dense model folder (embedded models), HF
    exports, GGUF files, the iterative cells' keep sets and blocks."""
    t = _check(config)
    files = [paths.model_dir(t["model"])] if config["models"][t["model"]]["source"] == "embedded" else []
    for cell in measured_cells(config)[1:]:
        files += [cell["hf"]] if cell.get("hf") else [cell["build"]["keep"], *cell["build"]["comp"]]
    for cell in measured_cells(config):
        files += list(cell["gguf"].values())
    return files
