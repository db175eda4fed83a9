"""Tables, figures and the browsable report from per-cell JSON files."""

from __future__ import annotations

import json
import math

import pandas as pd

from coec.report import build_table, metric_value, to_markdown, write_report


def _cell(path, **obj):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj))
    return str(path)


def test_table_rows_metrics_and_markdown(tmp_path):
    a = _cell(tmp_path / "a/ppl.json", ppl=12.345)
    b = _cell(tmp_path / "b/zs.json", mean7=0.5, tasks={"arc_easy": {"value": 0.6}})
    spec = {"metric": "ppl", "models": ["m1", "m2"], "label_columns": ["selection", "compensation"],
            "rows": [{"labels": {"selection": "wanda_sp", "compensation": "none"},
                      "cells": {"m1": a}},
                     {"labels": {"selection": "rcpu", "compensation": "coec"},
                      "cells": {"m1": a, "m2": b}}]}
    df = build_table(spec)
    assert list(df.columns) == ["selection", "compensation", "m1", "m2"]
    assert df.iloc[0].tolist()[:3] == ["Wanda-sp", "–", 12.345] and math.isnan(df.iloc[0]["m2"])
    assert math.isnan(df.iloc[1]["m2"])  # the metric is missing from that file
    assert metric_value(b, "tasks.arc_easy.value") == 0.6
    md = to_markdown(df, 2, "cap")
    assert md.startswith("cap") and "| Wanda-sp | – | 12.35 | – |" in md
    out = tmp_path / "t.csv"
    write_report("table", dict(spec, caption="c"), out)
    assert pd.read_csv(out).shape == (2, 4) and out.with_suffix(".md").is_file()


def test_lines_figure_and_readme(tmp_path, monkeypatch):
    pts = {"none": [[8, _cell(tmp_path / "n8.json", ppl=30.0)], [16, _cell(tmp_path / "n16.json", ppl=25.0)]],
           "coec": [[8, _cell(tmp_path / "c8.json", ppl=20.0)], [16, _cell(tmp_path / "c16.json", ppl=18.0)]]}
    png = tmp_path / "results/figures/f.png"
    write_report("lines-figure", {"panels": {"30 %": pts}, "xlabel": "N", "ylabel": "ppl",
                                  "logx": True, "logy": True}, png)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000
    monkeypatch.chdir(tmp_path)
    write_report("table", {"metric": "ppl", "models": ["m"], "label_columns": ["x"],
                           "rows": [{"labels": {"x": "a"}, "cells": {"m": "n8.json"}}]},
                 "results/t.csv")
    write_report("readme", {"items": [{"path": "results/t.csv", "title": "T"},
                                      {"path": "results/figures/f.png", "title": "F", "caption": "cap"}]},
                 "results/README.md")
    text = (tmp_path / "results/README.md").read_text()
    assert "## T" in text and "| a | 30.00 |" in text and "![cap](figures/f.png)" in text
