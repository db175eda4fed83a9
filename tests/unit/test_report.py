"""Tables, figures and the browsable report from per-cell JSON files."""

from __future__ import annotations

import json
import math

import pandas as pd
import pytest

from coec.report.rendering import to_markdown
from coec.report.tables import build_table, metric_value, write_report


def _cell(path, **obj):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj))
    return str(path)


def test_table_rows_metrics_and_markdown(tmp_path):
    a = _cell(tmp_path / "a/ppl.json", ppl=12.345)
    b = _cell(tmp_path / "b/zs.json", mean7=0.5, tasks={"arc_easy": {"value": 0.6}})
    spec = {
        "metric": "ppl",
        "models": ["m1", "m2"],
        "label_columns": ["selection", "compensation"],
        "rows": [
            {"labels": {"selection": "wanda_sp", "compensation": "none"}, "cells": {"m1": a}},
            {"labels": {"selection": "rcpu", "compensation": "coec"}, "cells": {"m1": a, "m2": b}},
        ],
    }
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
    pts = {
        "none": [[8, _cell(tmp_path / "n8.json", ppl=30.0)], [16, _cell(tmp_path / "n16.json", ppl=25.0)]],
        "coec": [[8, _cell(tmp_path / "c8.json", ppl=20.0)], [16, _cell(tmp_path / "c16.json", ppl=18.0)]],
    }
    png = tmp_path / "results/figures/f.png"
    write_report(
        "lines-figure", {"panels": {"30 %": pts}, "xlabel": "N", "ylabel": "ppl", "logx": True, "logy": True}, png
    )
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000
    monkeypatch.chdir(tmp_path)
    write_report(
        "table",
        {
            "metric": "ppl",
            "models": ["m"],
            "label_columns": ["x"],
            "rows": [{"labels": {"x": "a"}, "cells": {"m": "n8.json"}}],
        },
        "results/t.csv",
    )
    write_report(
        "readme",
        {
            "items": [
                {"path": "results/t.csv", "title": "T"},
                {"path": "results/figures/f.png", "title": "F", "caption": "cap"},
            ]
        },
        "results/README.md",
    )
    text = (tmp_path / "results/README.md").read_text()
    assert "## T" in text and "| a | 30.00 |" in text and "![cap](figures/f.png)" in text


def _zeroshot_cell(folder, values: dict, stderr: dict, docs: dict):
    """A zeroshot.json with per-task values and stderrs, and per-sample records (doc -> acc)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "zeroshot_samples").mkdir()
    for task, accs in docs.items():
        (folder / "zeroshot_samples" / f"{task}.jsonl").write_text(
            "".join(json.dumps({"doc_id": i, "acc": a}) + "\n" for i, a in enumerate(accs))
        )
    return _cell(
        folder / "zeroshot.json",
        mean7=sum(values.values()) / len(values),
        tasks={t: {"value": values[t], "stderr": stderr[t]} for t in values},
    )


def test_zeroshot_table_shows_its_noise(tmp_path):
    """Each cell's mean with sqrt(sum SE_t^2) / T, each compared cell's paired difference with its
    paired standard error (closed forms), in the CSV and as 'v ± se' in the Markdown twin."""
    import numpy as np

    g = np.random.default_rng(0)
    docs_a = {t: g.integers(0, 2, 40).astype(float).tolist() for t in ("boolq", "rte")}
    docs_b = {t: [1.0 - x if g.random() < 0.2 else x for x in docs_a[t]] for t in docs_a}
    val = {k: {t: float(np.mean(d[t])) for t in d} for k, d in (("a", docs_a), ("b", docs_b))}
    se = {k: {t: float(np.std(d[t], ddof=1) / np.sqrt(40)) for t in d} for k, d in (("a", docs_a), ("b", docs_b))}
    a = _zeroshot_cell(tmp_path / "a", val["a"], se["a"], docs_a)
    b = _zeroshot_cell(tmp_path / "b", val["b"], se["b"], docs_b)
    spec = {
        "metric": "mean7",
        "models": ["m"],
        "label_columns": ["selection", "compensation"],
        "zeroshot_tasks": ["boolq", "rte"],
        "paired": True,
        "caption": "cap",
        "rows": [
            {"labels": {"selection": "rcpu", "compensation": "none"}, "cells": {"m": a}, "compare": None},
            {"labels": {"selection": "rcpu", "compensation": "coec"}, "cells": {"m": b}, "compare": 0},
        ],
    }
    out = tmp_path / "t.csv"
    write_report("table", spec, out)
    df = pd.read_csv(out, keep_default_na=False, na_values=[""])
    assert list(df.columns) == ["selection", "compensation", "vs", "m", "m se", "m diff", "m diff se"]
    for row, k in zip(df.itertuples(), "ab"):
        assert row.m == pytest.approx(np.mean(list(val[k].values())), abs=1e-4)
        assert row[5] == pytest.approx(np.sqrt(sum(s * s for s in se[k].values())) / 2, abs=1e-4)
    d = {t: np.array(docs_b[t]) - np.array(docs_a[t]) for t in docs_a}
    diff = np.mean([d[t].mean() for t in d])
    paired = np.sqrt(sum((d[t].std(ddof=1) / np.sqrt(40)) ** 2 for t in d)) / 2
    assert math.isnan(df["vs"].iloc[0]) and df["vs"].iloc[1] == "–"  # compared with prune-only
    assert df["m diff"].iloc[1] == pytest.approx(diff, abs=1e-4) and math.isnan(df["m diff"].iloc[0])
    assert df["m diff se"].iloc[1] == pytest.approx(paired, abs=1e-4)
    unpaired = np.sqrt(sum(se["a"][t] ** 2 + se["b"][t] ** 2 for t in d)) / 2
    assert paired < unpaired  # the shared documents cancel
    md = out.with_suffix(".md").read_text()
    mean_b, se_b = 100 * np.mean(list(val["b"].values())), 100 * np.sqrt(sum(s * s for s in se["b"].values())) / 2
    assert f"| {mean_b:.2f} ± {se_b:.2f} | {100 * diff:+.2f} ± {100 * paired:.2f} |" in md
    assert md.startswith("cap")


def test_claims_read_only_the_model_columns_of_a_zeroshot_table(tmp_path):
    from coec.report.claims.core import _long
    from coec.report.columns import is_model_column

    path = tmp_path / "t.csv"
    path.write_text("ratio,selection,compensation,vs,m,m se,m diff,m diff se\n0.3,rcpu,coec,–,0.5,0.02,0.01,0.005\n")
    assert [r["model"] for r in _long([path], ("ratio", "selection", "compensation"))] == ["m"]
    assert not is_model_column("vs", ()) and is_model_column("m", ("ratio",))
