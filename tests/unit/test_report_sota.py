"""The state-of-the-art table (coec.report.sota): realised prunable parameters against an
independent count (a transformers model of the pruned shape), the budget check, every column."""

from __future__ import annotations

import json
import logging
import math

import pandas as pd
import pytest

from coec.report.cost import arch_dims
from coec.report.sota import dense_prunable, kept_prunable, sota_table, write_sota, zeroshot_mean

CFG = {
    "model_type": "llama",
    "hidden_size": 96,
    "num_attention_heads": 6,
    "num_key_value_heads": 3,
    "head_dim": 16,
    "num_hidden_layers": 3,
    "intermediate_size": 96,
    "vocab_size": 128,
}
TASKS = ["boolq", "rte"]


def _torch_params(cfg, kv=None, ffn=None):
    """Parameter count of a real transformers Llama of the given shape (the independent oracle)."""
    transformers = pytest.importorskip("transformers")
    c = dict(cfg)
    if kv is not None:
        group = cfg["num_attention_heads"] // cfg["num_key_value_heads"]
        c.update(num_key_value_heads=kv, num_attention_heads=kv * group)
    if ffn is not None:
        c["intermediate_size"] = ffn
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**c))
    return sum(p.numel() for p in model.parameters())


def _keep(widths):
    return {"layers": [{"kv_groups": list(range(g)), "channels": list(range(c))} for g, c in widths]}


def test_prunable_counts_match_a_real_model_of_the_pruned_shape():
    d = arch_dims(CFG)
    full = _torch_params(CFG)
    for g, c in [(2, 64), (1, 32), (3, 96)]:
        removed = full - _torch_params(CFG, kv=g, ffn=c)
        assert dense_prunable(d) - kept_prunable(d, _keep([(g, c)] * 3)) == removed
    # per-layer widths: the sum of the layers' own counts
    mixed = _keep([(3, 96), (1, 0), (2, 32)])
    assert kept_prunable(d, mixed) == sum(kept_prunable(d, _keep([w])) for w in [(3, 96), (1, 0), (2, 32)])
    assert kept_prunable(d, _keep([(3, 96)] * 3)) == dense_prunable(d)


def _json(path, **obj):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj))
    return str(path)


def _cell(root, name, widths, ppl, kl, accs):
    folder = root / name
    zs = {t: {"value": a, "stderr": 0.05} for t, a in zip(TASKS, accs, strict=True)}
    return {
        "ppl": _json(folder / "ppl.json", coec_format="ppl", coec_format_version=1, ppl=ppl, kl=kl, params=1000),
        "zeroshot": _json(folder / "zeroshot.json", coec_format="zeroshot", coec_format_version=1, tasks=zs),
        "keep": _json(folder / "keep.json", **_keep(widths)),
    }


def _spec(tmp_path, rows, tolerance=0.005):
    (tmp_path / "model").mkdir()
    (tmp_path / "model/config.json").write_text(json.dumps(CFG))
    dense = _cell(tmp_path, "dense", [(3, 96)] * 3, 10.0, 0.0, [0.7, 0.6])
    return {
        "models": ["m"],
        "model_paths": {"m": str(tmp_path / "model")},
        "dense": {"m": {k: dense[k] for k in ("ppl", "zeroshot")}},
        "rows": [
            {"selection": s, "compensation": c, "label": "", "cells": {"m": _cell(tmp_path, f"{s}-{c}", w, p, k, a)}}
            for s, c, w, p, k, a in rows
        ],
        "tolerance": tolerance,
        "tasks": TASKS,
        "caption": "cap",
    }


def test_table_columns_values_and_markdown(tmp_path):
    rows = [
        ("rcpu", "coec", [(2, 64)] * 3, 40.0, 0.5, [0.6, 0.5]),
        ("search", "coec", [(3, 32), (2, 64), (1, 96)], 30.0, 0.3, [0.65, 0.55]),
    ]
    spec = _spec(tmp_path, rows)
    df = sota_table(spec)
    d = arch_dims(CFG)
    assert df["selection"].tolist() == ["dense", "rcpu", "search"]
    assert df["prunable"].tolist() == [dense_prunable(d), *(kept_prunable(d, _keep(r[2])) for r in rows)]
    assert df.loc[0, "pruned %"] == 0.0 and math.isnan(df.loc[0, "Δ %"])
    expect_delta = 100 * (df.loc[2, "prunable"] - df.loc[1, "prunable"]) / df.loc[1, "prunable"]
    assert df.loc[1, "Δ %"] == 0.0 and df.loc[2, "Δ %"] == pytest.approx(expect_delta)
    assert df["ppl"].tolist() == [10.0, 40.0, 30.0] and df["kl"].tolist() == [0.0, 0.5, 0.3]
    assert df.loc[2, "mean7"] == pytest.approx(0.6) and df.loc[2, "mean7 se"] == pytest.approx(math.sqrt(2) * 0.05 / 2)
    out = tmp_path / "table_sota.csv"
    write_sota(spec, out)
    assert pd.read_csv(out).shape == (3, 12)
    md = out.with_suffix(".md").read_text()
    assert md.startswith("cap") and "| 30.00 | 0.3000 | 0.6000 |" in md


def test_a_row_off_the_budget_is_flagged(tmp_path, caplog):
    rows = [("rcpu", "coec", [(2, 64)] * 3, 40.0, 0.5, [0.6, 0.5]), ("x", "coec", [(3, 96)] * 3, 9.0, 0.0, [0.7, 0.6])]
    with caplog.at_level(logging.WARNING):
        sota_table(_spec(tmp_path, rows))
    assert "off the first row's" in caplog.text


def test_a_missing_task_is_refused(tmp_path):
    tasks = {"boolq": {"value": 1, "stderr": 0}}
    path = _json(tmp_path / "zs.json", coec_format="zeroshot", coec_format_version=1, tasks=tasks)
    with pytest.raises(ValueError, match="rte"):
        zeroshot_mean(path, TASKS)


def test_a_uniform_budget_is_the_named_width_rules_uniform_cell():
    """``budget: {uniform: S}`` (the wiring's width rule of S) is the prunable parameters of the
    uniform cell of S's widths at the ratio, counted as the table counts a keep set."""
    from coec.select.scores import KeepRule, n_keep
    from coec.select.search.stage import resolve_budget

    cfg = dict(CFG, intermediate_size=1536, num_hidden_layers=4)
    rule = KeepRule(0.3, "nearest", "nearest", 256)  # the candidates' rule: 1024 channels
    got = resolve_budget(cfg, rule, {"uniform": {"channel_multiple": 1, "channel_rounding": "ceil"}})
    kv, ch = n_keep(3, 0.3, "nearest"), n_keep(1536, 0.3, "ceil")
    assert ch == 1076
    d = arch_dims(cfg)
    assert got == {"params": kept_prunable(d, _keep([(kv, ch)] * 4)) - kept_prunable(d, _keep([(0, 0)] * 4))}
    assert resolve_budget(cfg, rule, None) is None and resolve_budget(cfg, rule, {"params": 5}) == {"params": 5}
