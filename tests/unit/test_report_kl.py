"""The KL column and metric of a perplexity table (docs/kl.md): ``columns: [kl]`` adds
``<model> kl`` beside each model (4 digits in the Markdown twin), ``metric: kl`` reads ppl.json,
and a table that asks for neither keeps its spec."""

from __future__ import annotations

import pandas as pd
import pytest

from coec.report.columns import is_model_column
from coec.report.rendering import to_markdown


def test_kl_columns_of_a_perplexity_table(tmp_path):
    from coec.io import artifacts
    from coec.report.tables import build_table, write_report

    cells = {}
    for name, ppl, kl in (("dense", 10.0, 0.0), ("cell", 14.0, 0.123456)):
        cells[name] = str(tmp_path / f"{name}.json")
        artifacts.write_result(cells[name], {"ppl": ppl, "kl": kl}, "ppl")
    rows = [
        {"labels": {"ratio": r, "selection": s}, "cells": {"m": cells[s]}} for r, s in ((0.0, "dense"), (0.3, "cell"))
    ]
    spec = {"metric": "ppl", "digits": 2, "models": ["m"], "label_columns": ["ratio", "selection"], "rows": rows}
    assert list(build_table(spec).columns) == ["ratio", "selection", "m"]
    df = build_table(dict(spec, columns=["kl"]))
    assert list(df.columns) == ["ratio", "selection", "m", "m kl"] and df["m kl"].tolist() == [0.0, 0.123456]
    assert is_model_column("m", ("ratio",)) and not is_model_column("m kl", ("ratio",))
    write_report("table", dict(spec, columns=["kl"]), tmp_path / "t.csv")
    md = (tmp_path / "t.md").read_text()
    assert "| 0.3 | cell | 14.00 | 0.1235 |" in md
    assert build_table(dict(spec, metric="kl"))["m"].tolist() == [0.0, 0.123456]
    assert to_markdown(pd.DataFrame({"a": [1.23456]})) == "| a |\n|---|\n| 1.23 |\n"


def test_table_specs_ask_for_the_kl_column():
    from coec.workflow.targets.tables import table_file, table_spec

    cfg = {
        "calibration": {"c": {"nsamples": 1}},
        "evaluation": {"ppl_dataset": "d", "ppl_seqlen": 8},
        "table1": {
            "calibration": "c",
            "models": ["m"],
            "ratios": [0.5],
            "rows": [{"selection": "s", "compensation": "x"}],
            "metric": "ppl",
        },
    }
    assert "columns" not in table_spec(cfg, "table1", "ppl.json")  # unchanged unless asked for
    cfg["table1"]["columns"] = ["kl"]
    assert table_spec(cfg, "table1", "ppl.json")["columns"] == ["kl"]
    cfg["extra_tables"] = {"t": dict(cfg["table1"], metric="kl")}
    assert table_file(cfg, "t") == "ppl.json"
    cfg["extra_tables"]["z"] = dict(cfg["table1"], metric="mean7")
    with pytest.raises(ValueError, match="need a perplexity table"):
        table_spec(cfg, "z", table_file(cfg, "z"))
