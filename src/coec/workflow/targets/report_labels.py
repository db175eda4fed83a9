"""Titles, captions and labels of every table and figure: results/README.md and the Snakemake
report (``snakemake --report``), in paper order."""

from __future__ import annotations

import os
from typing import Any

from coec.io import paths
from coec.iterative import targets as iterative_targets
from coec.workflow.targets.figures import appc_caption, fig2_spec
from coec.workflow.targets.tables import table_cfg

Config = dict[str, Any]
Item = tuple[str, str, str]
METRIC_WORDS = {
    "ppl": "perplexity",
    "kl": "mean token KL to the dense model",
    "mean7": "zero-shot mean accuracy (7 tasks)",
}


def sparsity_words(config: Config, table: str) -> str:
    """'30 % column sparsity' (or '10 %, 20 % ...') of a table's ratios."""
    return ", ".join(f"{float(r) * 100:g} %" for r in table_cfg(config, table)["ratios"]) + " column sparsity"


def _paper_items(config: Config) -> list[Item]:
    """(path, title, caption) of the paper's tables and Fig. 2 the config defines."""
    items = [
        (paths.table_file("table1"), f"Table 1: perplexity at {sparsity_words(config, 'table1')}", ""),
        (
            paths.table_file("table2"),
            f"Table 2: zero-shot mean accuracy (7 tasks) at {sparsity_words(config, 'table2')}",
            "",
        ),
    ]
    if "table3" in config:
        items.append((paths.table_file("table3"), "Table 3: ablation ladder (perplexity)", ""))
    if "table4" in config:
        items.append((paths.table_file("table4"), "Table 4: deployment cost", ""))
    if "table_sota" in config:
        items.append((paths.table_file("table_sota"), "The state of the art at one budget", ""))
    if "fig2" in config:
        fig2 = (paths.figure_file("fig2_calibration_size"), "Fig. 2: perplexity against calibration size")
        items.append((*fig2, fig2_spec(config)["caption"]))
    return items


def report_items(config: Config) -> list[Item]:
    """[(path, title, caption)] of every table and figure the config defines, in paper order;
    tables carry their caption in their .md twin, figures get it here."""
    items = _paper_items(config)
    for name, t in (config.get("extra_tables") or {}).items():
        words = METRIC_WORDS.get(t["metric"], t["metric"])
        items.append((paths.table_file(name), f"{name}: {words} at {sparsity_words(config, name)}", ""))
    if "appC" in config:
        items += [
            (paths.table_file("appC"), "App. C: geometry summary", ""),
            (paths.figure_file("appC_angles"), "App. C: principal angles per layer", appc_caption(config)),
        ]
    items += iterative_targets.report_items(config)
    return items


def readme_spec(config: Config, configfiles: list[str]) -> dict[str, Any]:
    """The spec of results/README.md: the config files (relative to the repository) and every
    table and figure with its title and caption."""
    return {
        "configfiles": " + ".join(configfiles) or "config.yaml",
        "items": [{"path": p, "title": t, "caption": c} for p, t, c in report_items(config)],
    }


def report_label(config: Config, path: str) -> dict[str, str]:
    """The label of a table or figure in the Snakemake report: its title (report_items)."""
    titles = {p: t for p, t, _ in report_items(config)}
    return {"artifact": titles.get(path, os.path.basename(path))}


def report_table_kind(config: Config, name: str) -> str:
    """The subcategory of a table in the report's Tables category: what its numbers are."""
    metric = table_cfg(config, name)["metric"]
    return "Perplexity" if metric in ("ppl", "kl") else "Zero-shot accuracy"
