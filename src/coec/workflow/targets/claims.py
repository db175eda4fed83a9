"""The spec of the claims report (``coec.report.claims``): the configured result files each claim reads."""

from __future__ import annotations

from typing import Any

from coec.io import paths
from coec.iterative import targets as iterative_targets
from coec.workflow.targets.figures import fig2_spec, figure_inputs

Config = dict[str, Any]


def claims_spec(config: Config) -> dict[str, Any]:
    """The spec of coec.report.claims: the configured result files each claim reads."""
    extra = config.get("extra_tables") or {}
    ppl = [paths.table_file("table1")] + [paths.table_file(n) for n, t in extra.items() if t["metric"] == "ppl"]
    zs = [paths.table_file("table2")] + [paths.table_file(n) for n, t in extra.items() if t["metric"] == "mean7"]
    spec = {
        "ppl_tables": ppl,
        "zeroshot_tables": zs,
        "table3": paths.table_file("table3") if "table3" in config else None,
        "table3_rows": [r["compensation"] for r in config["table3"]["rows"]] if "table3" in config else [],
        "table4": paths.table_file("table4") if "table4" in config else None,
        "appC": paths.table_file("appC") if "appC" in config else None,
        "fig2": fig2_spec(config)["panels"] if "fig2" in config else None,
    }
    spec.update(iterative_targets.claims_spec(config))
    return spec


def claims_inputs(config: Config) -> list[str]:
    """Every result file the claims report reads: each table the spec names, and the cells of
    each figure (a ``{panel: {line: [[N, file], ...]}}`` entry)."""
    files: list[str] = []
    for key, value in claims_spec(config).items():
        if key.endswith("_tables"):
            files += value
        elif isinstance(value, str):
            files.append(value)
        elif isinstance(value, dict):
            files += figure_inputs({"panels": value})
    return sorted(set(files))
