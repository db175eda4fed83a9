"""The specs of the figures (Fig. 2, App. C) and the result files each reads."""

from __future__ import annotations

import json
from typing import Any

from coec.io.paths import cell_dir, fmt_ratio
from coec.workflow.targets.calibrations import sized_calibration

Config = dict[str, Any]


def figure_inputs(spec: dict[str, Any]) -> list[str]:
    """Every result file a lines-figure spec reads."""
    return sorted({p for s in spec["panels"].values() for pts in s.values() for _, p in pts})


def size_figure_spec(panels: dict[str, Any], seqlen: int, caption: str) -> dict[str, Any]:
    """The lines-figure spec of a perplexity-against-calibration-size figure."""
    return {
        "panels": panels,
        "metric": "ppl",
        "logx": True,
        "logy": True,
        "xlabel": f"calibration sequences N (x {seqlen} tokens)",
        "ylabel": "perplexity",
        "caption": caption,
    }


def fig2_spec(config: Config) -> dict[str, Any]:
    """Fig. 2: perplexity against calibration size, one panel per ratio, one line per comp."""
    f = config["fig2"]
    sized = {n: sized_calibration(config["calibration"], f["calibration"], n) for n in f["nsamples"]}
    panels = {}
    for r in f["ratios"]:
        panels[f"{round(float(r) * 100)} % column sparsity"] = {
            comp: [[n, f"{cell_dir(f['model'], sized[n], f['selection'], r, comp)}/ppl.json"] for n in f["nsamples"]]
            for comp in f["compensations"]
        }
    return size_figure_spec(
        panels,
        config["calibration"][f["calibration"]]["seqlen"],
        f"Fig. 2: perplexity vs calibration size, {f['model']}, {f['selection']} "
        f"selection recomputed at each N; eval {config['evaluation']['ppl_dataset']} "
        f"seqlen {config['evaluation']['ppl_seqlen']}",
    )


def appc_geometry(config: Config) -> str:
    """The geometry.csv of the App. C cell."""
    c = config["appC"]
    return f"{cell_dir(c['model'], c['calibration'], c['selection'], c['ratio'], c['compensation'])}/geometry.csv"


def appc_caption(config: Config) -> str:
    """The caption of the App. C table and angle figure: the cell and what O, P, C are."""
    c = config["appC"]
    return (
        f"App. C geometry: {c['model']}, calibration {c['calibration']}, {c['selection']} "
        f"selection at {fmt_ratio(c['ratio'])}, compensation {c['compensation']} "
        f"({json.dumps(config['compensations'][c['compensation']], sort_keys=True)}); O = original read "
        f"frame on kept coordinates, P = pruned W_K, C = compensated; o_proj r_p=16, down_proj r=64"
    )


def appc_spec(config: Config) -> dict[str, Any]:
    """The spec of the App. C summary table and angle figure."""
    return {"geometry": appc_geometry(config), "caption": appc_caption(config)}
