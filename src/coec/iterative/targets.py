"""Which result files the iterative multi-domain FLAP method's table and figure read, and its
paths: pure functions of the workflow config (its ``iterative`` and ``domains`` sections), as
:mod:`coec.workflow.targets` is for the paper's grid.

    results/{model}/{calib}/iterative/{method}/steps/{r1}/{r2}/.../   one cached pruning step each
    results/{model}/{calib}/iterative/{variant}-{ratio}/              a cell
    resources/domains/{domain}/calib.txt                              a domain's text
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from typing import Any

from coec.io import paths
from coec.io.paths import cell_dir as grid_cell_dir
from coec.io.paths import fmt_ratio
from coec.iterative.schedule import make_schedule
from coec.workflow.targets.calibrations import sized_calibration, sized_entry
from coec.workflow.targets.figures import size_figure_spec
from coec.workflow.targets.sources import dataset_spec
from coec.workflow.targets.tables import with_comparisons

Config = dict[str, Any]
#: need(kind, name, where): raises (naming ``where``) unless ``config[kind]`` has an entry ``name``
Need = Callable[[str, str, str], None]


def domain_dir(name: str) -> str:
    """Folder of a domain's calibration text (``iterative_domain``)."""
    return f"{paths.RESOURCES}/domains/{name}"


def section(config: Config) -> dict[str, Any]:
    """The config's `iterative` section ({} without one)."""
    out: dict[str, Any] = config.get("iterative", {})
    return out


def mix_entries(config: Config) -> dict[str, Any]:
    """The config's ``iterative.mixes`` ({} without)."""
    out: dict[str, Any] = section(config).get("mixes", {})
    return out


def variant_entries(config: Config) -> dict[str, Any]:
    """The config's ``iterative.variants`` ({} without)."""
    out: dict[str, Any] = section(config).get("variants", {})
    return out


def check_config(config: Config) -> None:
    """Mix names distinct from calibration names; every mix domain and domain dataset known."""
    known, doms = mix_entries(config), config.get("domains", {})
    both = sorted(set(known) & set(config["calibration"]))
    if both:
        raise ValueError(f"config: iterative.mixes {both} also name calibration entries")
    for name, mix in known.items():
        for d in mix["domains"]:
            if d not in doms:
                raise ValueError(
                    f"config: iterative.mixes.{name}.domains names unknown domain "
                    f"{d!r} (known: {', '.join(doms) or 'none'})"
                )
    for name, dom in doms.items():
        if dom["source"] == "dataset" and dom.get("dataset") not in config["datasets"]:
            raise ValueError(f"config: domains.{name}.dataset names unknown dataset {dom.get('dataset')!r}")


def check_references(config: Config, need: Need) -> None:
    """Every name the iterative table's and figure's rows use (``need``), and each row's
    ``compare`` label (ValueError)."""
    it = section(config)
    for key in ("table", "calibration_size"):
        rows = it.get(key, {}).get("rows", [])
        for i, row in enumerate(rows):
            if "compensation" in row:
                need("compensations", row["compensation"], f"iterative.{key}.rows[{i}].compensation")
            if "compare" in row and row["compare"] not in {r["label"] for r in rows}:
                raise ValueError(f"config: iterative.{key}.rows[{i}].compare: no row is labelled {row['compare']!r}")
    for i, m in enumerate(it.get("table", {}).get("models", [])):
        need("models", m, f"iterative.table.models[{i}]")
    if "calibration_size" in it:
        need("models", it["calibration_size"]["model"], "iterative.calibration_size.model")


def model_calibrations(config: Config) -> Iterable[tuple[list[str], list[str | None]]]:
    """(models, calibrations or mixes) of the iterative table and calibration-size figure."""
    it = section(config)
    if "table" in it:
        t = it["table"]
        yield t["models"], [t["calibration"]] + [r.get("calibration") for r in t["rows"]]
    if "calibration_size" in it:
        f = it["calibration_size"]
        base = f.get("calibration", it.get("table", {}).get("calibration"))
        yield [f["model"]], [base] + [r.get("calibration") for r in f["rows"]]


def seqlen_key(config: Config, calib: str) -> tuple[str, int] | None:
    """(config key, length) of an iterative mix; None for another name."""
    mixes = mix_entries(config)
    return (f"iterative.mixes.{calib}.seqlen", mixes[calib]["seqlen"]) if calib in mixes else None


def sized(config: Config, calib: str, n: int | str) -> str:
    """Name of calibration or mix ``calib`` resized to n sequences (itself when n is its size)."""
    known = mix_entries(config)
    return sized_calibration(known if calib in known else config["calibration"], calib, n)


def size_base(config: Config) -> str | None:
    """The default calibration of the iterative calibration-size figure's rows."""
    it = section(config)
    base = it["calibration_size"].get("calibration", it.get("table", {}).get("calibration"))
    return None if base is None else str(base)


def size_calibrations(config: Config) -> tuple[dict[str, Any], dict[str, Any]]:
    """The resized (calibrations, mixes) of the iterative calibration-size figure, each
    name -> entry (what the wiring object adds to its view of the config)."""
    it = section(config)
    calibs: dict[str, Any] = {}
    mixes: dict[str, Any] = {}
    if "calibration_size" not in it:
        return calibs, mixes
    base = size_base(config)
    if base is None:
        raise ValueError("config: iterative.calibration_size needs a calibration (or iterative.table.calibration)")
    known = mix_entries(config)
    for row in it["calibration_size"]["rows"]:
        calib = row.get("calibration", base)
        registry, out = (known, mixes) if calib in known else (config["calibration"], calibs)
        for n in it["calibration_size"]["nsamples"]:
            for name, entry in sized_entry(registry, calib, n).items():
                out.setdefault(name, entry)
    return calibs, mixes


def calibration_entry(config: Config, name: str) -> dict[str, Any]:
    """A calibration entry or an iterative mix."""
    known = mix_entries(config)
    entry: dict[str, Any] | None = known.get(name, config["calibration"].get(name))
    if entry is not None:
        return entry
    raise ValueError(f"unknown calibration {name!r}: not in calibration nor iterative.mixes")


def calibration_key(config: Config, name: str) -> str:
    """The config key of a calibration entry or an iterative mix."""
    return f"iterative.mixes.{name}" if name in mix_entries(config) else f"calibration.{name}"


def domain_spec(config: Config, name: str) -> dict[str, Any]:
    """The data.load_split spec of a domain's calibration text."""
    d = config.get("domains", {})[name]
    if d["source"] == "dataset":
        return dataset_spec(config, d["dataset"])
    return {"source": "files", "calib": f"{domain_dir(name)}/calib.txt"}


def calibration_domains(config: Config, calib: str) -> list[dict[str, Any]]:
    """[{name, alpha, dataset}] of an iterative calibration (one domain for `calibration`)."""
    known = mix_entries(config)
    if calib in known:
        return [
            {"name": d, "alpha": float(a), "dataset": domain_spec(config, d)}
            for d, a in known[calib]["domains"].items()
        ]
    ds = calibration_entry(config, calib)["dataset"]
    return [{"name": ds, "alpha": 1.0, "dataset": dataset_spec(config, ds)}]


def variant_spec(config: Config, name: str) -> dict[str, Any]:
    """An ``iterative.variants`` entry; ValueError naming the known ones."""
    known = variant_entries(config)
    if name not in known:
        raise ValueError(f"unknown iterative variant {name!r} (known: {', '.join(known)})")
    entry: dict[str, Any] = known[name]
    return entry


def step_method(config: Config, name: str) -> str:
    """The step folder's method of a variant: {mode}-{structure}."""
    v = variant_spec(config, name)
    return f"{v['mode']}-{v['structure']}"


def chain(config: Config, variant: str, ratio: float | str) -> list[str]:
    """The step folders of a cell, e.g. ['0.1', '0.1/0.2', '0.1/0.2/0.3']."""
    v = variant_spec(config, variant)
    sched = [fmt_ratio(r) for r in make_schedule(float(ratio), v.get("steps"), v.get("step"))]
    return ["/".join(sched[: s + 1]) for s in range(len(sched))]


def steps_dir(model: str, calib: str, method: str) -> str:
    """The folder of a method's cached pruning steps on a calibration."""
    return f"{paths.RESULTS}/{model}/{calib}/iterative/{method}/steps"


def cell_steps(config: Config, model: str, calib: str, variant: str, ratio: float | str) -> list[str]:
    """The step folders a cell's chain runs through, first to last."""
    base = steps_dir(model, calib, step_method(config, variant))
    return [f"{base}/{c}" for c in chain(config, variant, ratio)]


def cell_dir(model: str, calib: str, variant: str, ratio: float | str) -> str:
    """The folder of an iterative cell."""
    return f"{paths.RESULTS}/{model}/{calib}/iterative/{variant}-{fmt_ratio(ratio)}"


def row_file(model: str, calib: str, row: dict[str, Any], ratio: float | str, filename: str) -> str:
    """A table/figure row's result file: an iterative cell (variant) or a workflow cell
    (selection + compensation) on calibration `calib`."""
    if "variant" in row:
        return f"{cell_dir(model, calib, row['variant'], ratio)}/{filename}"
    return f"{grid_cell_dir(model, calib, row['selection'], ratio, row['compensation'])}/{filename}"


def table_spec(config: Config, filename: str = "ppl.json", metric: str = "ppl") -> dict[str, Any]:
    """Rows (ratio x method) of table_iterative: workflow cells (selection + compensation on the
    table's calibration) and iterative cells (variant on a calibration or mix)."""
    t = section(config)["table"]
    mixes_cfg = mix_entries(config)
    models = t["models"]
    rows = [
        {"labels": {"ratio": 0.0, "method": "dense"}, "cells": {m: f"{paths.dense_dir(m)}/{filename}" for m in models}}
    ]
    groups: list[Any] = [None]
    for r in t["ratios"]:
        for row in t["rows"]:
            calib = row.get("calibration", t["calibration"])
            cells = {m: row_file(m, calib, row, r, filename) for m in models}
            rows.append({"labels": {"ratio": float(r), "method": row["label"]}, "cells": cells})
            groups.append((float(r), row["label"], row.get("compare")))
    used = {n: mixes_cfg[n] for n in sorted({row.get("calibration") for row in t["rows"]} & set(mixes_cfg))}
    spec = {
        "metric": metric,
        "digits": 2 if metric == "ppl" else 4,
        "models": models,
        "label_columns": ["ratio", "method"],
        "rows": rows,
        "caption": f"table_iterative: {metric} | calibration {t['calibration']} | mixes "
        f"{json.dumps(used, sort_keys=True)} | variants "
        f"{json.dumps(variant_entries(config), sort_keys=True)} | evaluation "
        f"{json.dumps(config['evaluation'], sort_keys=True)}",
    }
    return with_comparisons(config, spec, groups, "iterative.table.rows")


def zeroshot_table_spec(config: Config) -> dict[str, Any]:
    """table_iterative_zeroshot: the table_iterative cells scored by zero-shot mean7."""
    return table_spec(config, "zeroshot.json", "mean7")


def size_spec(config: Config) -> dict[str, Any]:
    """Seed Fig. 2: perplexity against calibration size N, one panel per ratio, one line per
    row; every row's calibration (or mix) is resized to N and everything downstream recomputed."""
    f = section(config)["calibration_size"]
    base = size_base(config)
    panels = {}
    for r in f["ratios"]:
        panels[f"{round(float(r) * 100)} % width pruned"] = {
            row["label"]: [
                [n, row_file(f["model"], sized(config, row.get("calibration", base), n), row, r, "ppl.json")]
                for n in f["nsamples"]
            ]
            for row in f["rows"]
        }
    calibs = sorted({row.get("calibration", base) for row in f["rows"]})
    return size_figure_spec(
        panels,
        calibration_entry(config, str(base))["seqlen"],
        f"iterative calibration size: {f['model']}, calibrations {', '.join(calibs)} "
        f"resized to N, selection recomputed at each N; variants "
        f"{json.dumps(variant_entries(config), sort_keys=True)}; eval "
        f"{config['evaluation']['ppl_dataset']} seqlen {config['evaluation']['ppl_seqlen']}",
    )


def claims_spec(config: Config) -> dict[str, Any]:
    """The entries of the claims spec (``coec.workflow.targets.claims_spec``) that the method's
    claims (``coec.iterative.claims``) read: its table and its calibration-size curves."""
    it = section(config)
    return {
        "table_iterative": paths.table_file("table_iterative") if "table" in it else None,
        "iterative_size": size_spec(config)["panels"] if "calibration_size" in it else None,
    }


def report_items(config: Config) -> list[tuple[str, str, str]]:
    """(path, title, caption) of the method's tables and figure in the README and the Snakemake
    report (``coec.workflow.targets.report_items``), in report order."""
    it = section(config)
    items = []
    if "table" in it:
        items += [
            (paths.table_file("table_iterative"), "Iterative multi-domain FLAP: perplexity", ""),
            (
                paths.table_file("table_iterative_zeroshot"),
                "Iterative multi-domain FLAP: zero-shot mean accuracy (7 tasks)",
                "",
            ),
        ]
    if "calibration_size" in it:
        items.append(
            (
                paths.figure_file("iterative_calibration_size"),
                "Iterative multi-domain FLAP: perplexity against calibration size",
                size_spec(config)["caption"],
            )
        )
    return items
