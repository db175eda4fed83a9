"""Pruned or quantized? The size–quality–speed frontier in llama.cpp (docs/frontier.md).

The config key ``frontier`` names a model, a calibration set, GGUF target names (``types``: the
types of ``coec.export.formats.GGUF_VARIANTS``; ``dense_types``: more of them, for the dense model
only, e.g. the llama.cpp mixes below 4 bits), ratios and rows (a selection and a compensation
each). Its cells are the dense model (exported at ``types`` then ``dense_types``) and every row at
every ratio (exported at ``types``). Every (cell, type) pair is one row of ``results/frontier.csv``:
the file's size, its perplexity measured in llama.cpp (``ppl-gguf-<type>.json``), its speed (the
measured-table harness, ``results/frontier_speed.csv``) and whether it is on the Pareto front of
size against perplexity.

Pure functions of the config (defaults filled by the schema) and of the files they name.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from coec.config.validate import ConfigError
from coec.io import paths
from coec.io.atomic import write_text

if TYPE_CHECKING:
    import pandas as pd

KEY = "frontier"
SPEED = "frontier_speed"
SPEED_KEYS = ("prompt_tokens", "new_tokens", "repeats", "threads", "seed")


def check(config: dict[str, Any]) -> dict[str, Any]:
    """The frontier's config, every name it uses checked (one line naming the key)."""
    t: dict[str, Any] = config[KEY]
    if t["model"] not in config["models"]:
        raise ConfigError(f"config: {KEY}.model: unknown model {t['model']!r}")
    if t["calibration"] not in config["calibration"]:
        raise ConfigError(f"config: {KEY}.calibration: unknown calibration set {t['calibration']!r}")
    for i, row in enumerate(t["rows"]):
        calib = row.get("calibration", t["calibration"])
        if calib not in config["calibration"]:
            raise ConfigError(f"config: {KEY}.rows[{i}].calibration: unknown calibration set {calib!r}")
        if row["compensation"] not in config["compensations"]:
            raise ConfigError(f"config: {KEY}.rows[{i}].compensation: unknown compensation {row['compensation']!r}")
        extra = [g for g in row.get("types", []) if g not in dense_types(t)]
        if extra:
            raise ConfigError(
                f"config: {KEY}.rows[{i}].types: {extra[0]!r} is not among the dense model's types "
                f"(types, dense_types): a row is measured against the dense file of its type"
            )
    return t


def row_label(row: dict[str, Any]) -> str:
    return row.get("label") or f"{row['selection']} + {row['compensation']}"


def dense_types(t: dict[str, Any]) -> list[str]:
    """The dense model's GGUF types: ``types``, then those of ``dense_types`` not among them
    (every GGUF type of the frontier: a row's are a subset)."""
    return list(dict.fromkeys([*t["types"], *t.get("dense_types", [])]))


def frontier_cells(config: dict[str, Any]) -> list[dict[str, Any]]:
    """The dense model, then every row at every ratio (the row's ``ratios``, else the frontier's):
    label, method, selection, compensation, ratio, its folder (GGUF files, perplexities), keep.json
    (None for dense) and its GGUF types (the row's ``types``, else the frontier's)."""
    t = check(config)
    model = t["model"]
    cells: list[dict[str, Any]] = [
        {
            "label": "dense",
            "method": "dense",
            "selection": "",
            "compensation": "",
            "ratio": 0.0,
            "folder": paths.dense_dir(model),
            "keep": None,
            "types": dense_types(t),
        }
    ]
    for row in t["rows"]:
        calib = row.get("calibration", t["calibration"])
        for ratio in row.get("ratios", t["ratios"]):
            cells.append(
                {
                    "label": f"{row_label(row)} {paths.fmt_ratio(ratio)}",
                    "method": row_label(row),
                    "selection": row["selection"],
                    "compensation": row["compensation"],
                    "ratio": ratio,
                    "folder": paths.cell_dir(model, calib, row["selection"], ratio, row["compensation"]),
                    "keep": paths.keep_file(model, calib, row["selection"], ratio),
                    "types": list(row.get("types", t["types"])),
                }
            )
    return cells


def speed_types(cell: dict[str, Any]) -> list[str]:
    """The GGUF files a cell is exported as: f16 (the measured harness reads its FLOP bound from
    it) and every type of the cell."""
    return list(dict.fromkeys(["f16", *cell["types"]]))


def speed_spec(config: dict[str, Any]) -> dict[str, Any]:
    """The spec of ``coec report --kind table4-measured`` for the frontier's speed
    (``results/frontier_speed.csv``): every cell's GGUF files, timed in llama.cpp at each of its
    types (the harness runs a runtime only on the cells with a file of its type)."""
    t = check(config)
    return {
        **{k: t[k] for k in SPEED_KEYS},
        "runtimes": [f"llamacpp-{g}" for g in dense_types(t)],  # every type (a row's are a subset)
        "cells": [
            {
                "label": c["label"],
                "ratio": c["ratio"],
                "gguf": {g: paths.gguf_file(c["folder"], g) for g in speed_types(c)},
            }
            for c in frontier_cells(config)
        ],
        "device": "cpu",
        "figure": paths.figure_file(SPEED),
        "caption": f"Frontier speed: {t['model']} dense and pruned, GGUF files of coec export --format gguf, "
        "in llama.cpp on this machine's CPU.",
    }


def speed_inputs(config: dict[str, Any]) -> list[str]:
    return [paths.gguf_file(c["folder"], g) for c in frontier_cells(config) for g in speed_types(c)]


def frontier_spec(config: dict[str, Any]) -> dict[str, Any]:
    """The spec of ``coec report --kind frontier``: the cells (each with its types), every type,
    the speed table and the figure."""
    t = check(config)
    return {
        "model": t["model"],
        "types": dense_types(t),
        "cells": frontier_cells(config),
        "speed": paths.table_file(SPEED),
        "figure": paths.figure_file(KEY),
        "caption": f"Pruned or quantized: {t['model']} dense and pruned, each GGUF file's size, its perplexity "
        "in llama.cpp (the evaluation windows of coec ppl) and its speed (results/frontier_speed.md).",
    }


def frontier_inputs(config: dict[str, Any]) -> list[str]:
    """Every file the frontier table reads: each cell's GGUF files and sidecars, their llama.cpp
    perplexities, the transformers perplexity and keep set of each cell, and the speed table."""
    t = check(config)
    model = t["model"]
    files = [paths.table_file(SPEED)]
    for c in frontier_cells(config):
        files.append(f"{c['folder']}/ppl.json")
        files += [c["keep"]] if c["keep"] else []
        for g in c["types"]:
            files += [paths.gguf_file(c["folder"], g), paths.gguf_report_file(c["folder"], g)]
            files.append(paths.gguf_ppl_file(c["folder"], g))
    return [f for f in files if f] + (
        [paths.model_dir(model)] if config["models"][model]["source"] == "embedded" else []
    )


# ----------------------------------------------------------------------------- the table
def pareto(sizes: list[float], ppls: list[float]) -> list[bool]:
    """Whether each point is on the front: no other point has both a smaller size and a lower
    perplexity (strictly in both; a point equal to another in both stays on it). NaN: never."""
    out = []
    for i, (s, p) in enumerate(zip(sizes, ppls, strict=True)):
        if s != s or p != p:  # NaN
            out.append(False)
            continue
        out.append(not any(j != i and sj < s and pj < p for j, (sj, pj) in enumerate(zip(sizes, ppls, strict=True))))
    return out


def realised_ratio(keep: str | None, ratio: float) -> float:
    """The fraction of MLP channels pruned: keep.json's ``realised_channel_ratio`` where the
    widths were aligned, else the configured ratio (0 for the dense model)."""
    if not keep:
        return 0.0
    return float(json.loads(Path(keep).read_text()).get("realised_channel_ratio", ratio))


def _json(path: str) -> dict[str, Any]:
    p = Path(path)
    return json.loads(p.read_text()) if p.is_file() else {}


def frontier_rows(spec: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per (cell, type of the cell) in config order, ``pareto`` over all rows with a
    perplexity."""
    import pandas as pd  # deferred: pandas, ~0.8 s at workflow planning

    speed = pd.read_csv(spec["speed"]) if Path(spec["speed"]).is_file() else pd.DataFrame()
    rows = []
    for c in spec["cells"]:
        fp32 = _json(f"{c['folder']}/ppl.json").get("ppl")
        realised = realised_ratio(c["keep"], c["ratio"])
        for g in c["types"]:
            gguf = Path(paths.gguf_file(c["folder"], g))
            ppl = _json(paths.gguf_ppl_file(c["folder"], g))
            side = _json(paths.gguf_report_file(c["folder"], g))
            timed = speed[(speed["cell"] == c["label"]) & (speed["type"] == g)] if len(speed) else speed
            t = timed.iloc[0].to_dict() if len(timed) else {}
            missing = [
                what for what, ok in (("gguf", gguf.is_file()), ("ppl", bool(ppl)), ("speed", bool(t))) if not ok
            ]
            rows.append(
                {
                    "cell": c["label"],
                    "method": c["method"],
                    "selection": c["selection"],
                    "compensation": c["compensation"],
                    "ratio": c["ratio"],
                    "realised_ratio": realised,
                    "type": g,
                    "file_mib": gguf.stat().st_size / 2**20 if gguf.is_file() else float("nan"),
                    "ppl": ppl.get("ppl", float("nan")),
                    "ppl_fp32": fp32 if fp32 is not None else float("nan"),
                    "decode_tok_s": t.get("decode_tok_s", float("nan")),
                    "prefill_tok_s": t.get("prefill_tok_s", float("nan")),
                    "fallbacks": len(side.get("fallbacks", [])) if side else float("nan"),
                    "status": t.get("status", "ok") if not missing else "missing " + ", ".join(missing),
                }
            )
    front = pareto([r["file_mib"] for r in rows], [r["ppl"] for r in rows])
    for r, on in zip(rows, front, strict=True):
        r["pareto"] = on
    return rows


MD_COLUMNS = {
    "cell": "cell",
    "type": "type",
    "realised_ratio": "pruned",
    "file_mib": "file MiB",
    "ppl": "ppl (llama.cpp)",
    "ppl_fp32": "ppl (fp32)",
    "decode_tok_s": "decode tok/s",
    "prefill_tok_s": "prefill tok/s",
    "fallbacks": "fallbacks",
    "pareto": "Pareto",
}


def speed_caption(spec: dict[str, Any]) -> str:
    """The speed table's caption (its machine, threads, repeats and load), for the frontier's."""
    md = Path(spec["speed"]).with_suffix(".md")
    if not md.is_file():
        return "speed not measured"
    return md.read_text().strip().splitlines()[0]


def write_frontier(spec: dict[str, Any], out: str | Path) -> pd.DataFrame:
    """Write ``out`` (CSV), its .md twin and the figure; returns the table (a DataFrame)."""
    import pandas as pd  # deferred: pandas, ~0.8 s at workflow planning

    from coec.io.artifacts import write_csv  # deferred: keeps the job boundary torch-free
    from coec.report.rendering import to_markdown  # deferred: pandas, ~0.8 s at workflow planning

    df = pd.DataFrame(frontier_rows(spec))
    out = Path(out)
    write_csv(out, df, float_format="%.4f")
    caption = f"{spec.get('caption', '')} Speed: {speed_caption(spec)} Table load: {os.getloadavg()[0]:.2f}."
    md = df[list(MD_COLUMNS)].rename(columns=MD_COLUMNS).assign(Pareto=df["pareto"].map({True: "yes", False: ""}))
    write_text(out.with_suffix(".md"), to_markdown(md, 2, caption))
    plot_frontier(df, spec.get("figure") or str(out.parent / "figures" / f"{out.stem}.png"), spec.get("caption", ""))
    return df


def plot_frontier(df: pd.DataFrame, out: str | Path, caption: str = "") -> None:
    """Panel 1: perplexity against file MiB, one series per method (dense across types; a
    pruned method across ratios and types), the Pareto front as a step line. Panel 2:
    perplexity against decode tokens/s."""
    import matplotlib  # deferred: matplotlib, ~1.1 s at workflow planning

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # deferred: matplotlib, ~1.1 s at workflow planning

    from coec.report.rendering import save_figure, set_caption  # deferred: pandas, ~0.8 s at workflow planning

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.8), sharey=True)
    markers = "os^DvP*X"
    for i, (method, d) in enumerate(df.groupby("method", sort=False)):
        style = {"color": "k" if method == "dense" else f"C{i}", "marker": markers[i % len(markers)], "ls": ""}
        axes[0].plot(d["file_mib"], d["ppl"], label=method, **style)
        axes[1].plot(d["decode_tok_s"], d["ppl"], label=method, **style)
        if method == "dense":
            for _, r in d.iterrows():
                axes[0].annotate(
                    r["type"], (r["file_mib"], r["ppl"]), fontsize=7, xytext=(3, 3), textcoords="offset points"
                )
    front = df[df["pareto"]].sort_values("file_mib")
    axes[0].step(front["file_mib"], front["ppl"], where="post", color="grey", lw=1, label="Pareto front")
    axes[0].set_xlabel("GGUF file (MiB)")
    axes[1].set_xlabel("decode tokens/s (batch 1)")
    axes[0].set_ylabel("perplexity in llama.cpp")
    for ax in axes:
        ax.set_yscale("log")
        ax.grid(alpha=0.3, which="both")
    axes[0].legend(fontsize=7)
    set_caption(fig, caption or "Pruned or quantized")
    save_figure(fig, out)
    plt.close(fig)
