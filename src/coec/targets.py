"""Which result files each table and figure reads, and its spec.

Pure functions of the workflow config (the dict Snakemake reads): the rules
(``workflow/rules/*.smk``) pass their results on as ``input:`` and ``params:``, so a spec that
changes here replans the table or figure that reads it. The only writes are the resized
calibration sets and mixes that Fig. 2 and the iterative calibration-size figure add to the
config once, before the rules are defined (``add_fig2_calibrations``,
``add_iterative_size_calibrations``).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from . import paths
from .paths import cell_dir, fmt_ratio

METRIC_WORDS = {"ppl": "perplexity", "mean7": "zero-shot mean accuracy (7 tasks)"}
TABLE_FILES = {"table1": "ppl.json", "table2": "zeroshot.json", "table3": "ppl.json"}


def method_inputs(config, comp, model, calib, select, ratio, first, last) -> dict[str, str]:
    """The extra inputs of a compensate job (``Method.inputs`` of compensation ``comp``'s method,
    with the entry's top-level options), name -> path; {} for a method that needs none."""
    from .compensate.inputs import Job
    from .compensate.options import method, resolve, top_level_options

    spec = config["compensations"][comp]
    m = method(spec["method"])
    if not m.inputs:
        return {}
    options = resolve(m.name, top_level_options(spec))
    job = Job(model=model, calib=calib, select=select, ratio=ratio, first=first, last=last)
    paths_in = {inp.name: inp.workflow_path(options, job) for inp in m.inputs}
    return {name: p for name, p in paths_in.items() if p is not None}


def consumers(config) -> dict[str, list[str]]:
    """{compensation: the compensations whose blocks its method reads (``OtherCell`` inputs:
    blend's ``base``)}, for those that read any."""
    from .compensate.inputs import OtherCell
    from .compensate.options import method, resolve, top_level_options

    out = {}
    for name, spec in config["compensations"].items():
        m = method(spec["method"])
        cells = [inp for inp in m.inputs if isinstance(inp, OtherCell)]
        if cells:
            options = resolve(m.name, top_level_options(spec))
            out[name] = sorted({getattr(options, inp.option) for inp in cells})
    return out


def base_cells(config) -> list[tuple[str, str]]:
    """(selection folder, compensation) of every cell whose blocks a method of another cell of
    the config's tables and Fig. 2 reads (blend's base), sorted."""
    reads = consumers(config)
    if not reads:
        return []
    files = [f for name in _table_names(config) for f in table_inputs(config, name)]
    if "fig2" in config:
        files += figure_inputs(fig2_spec(config))
    out = set()
    for f in files:
        cell = Path(f).parent
        for base in reads.get(cell.name, []) if cell.parent.name != paths.RESULTS else []:
            out.add((cell.parent.as_posix(), base))
    return sorted(out)


def _table_names(config) -> list[str]:
    return [t for t in ("table1", "table2", "table3") if t in config] + list(config.get("extra_tables") or {})


def gram_check_input(config, comp, model, calib) -> list[str]:
    """The Gram check a compensate job reads (``compensate.gram_check``): the calibration's, for a
    method that reports no errors of its own; none for one that does (coec)."""
    from .compensate.options import method

    return (
        [] if method(config["compensations"][comp]["method"]).reports_errors else [paths.gram_check_file(model, calib)]
    )


def model_path(config, name) -> str:
    """What the CLI loads: the converted folder for embedded models, else the hub id / dir."""
    m = config["models"][name]
    return paths.model_dir(name) if m["source"] == "embedded" else m["source"]


def dataset_spec(config, name) -> dict:
    """The data.load_split spec of a dataset (embedded ones read their converted folder)."""
    d = dict(config["datasets"][name])
    if d["source"] == "embedded":
        d["dir"] = paths.text_dir(name)
    return d


def spec_inputs(spec) -> list[str]:
    """Every result file a table spec reads (a zero-shot table's per-sample records too)."""
    files = {p for row in spec["rows"] for p in row["cells"].values()}
    files |= {p for row in spec["rows"] for ps in row.get("samples", {}).values() for p in ps}
    return sorted(files)


def figure_inputs(spec) -> list[str]:
    """Every result file a lines-figure spec reads."""
    return sorted({p for s in spec["panels"].values() for pts in s.values() for _, p in pts})


# ----------------------------------------------------------------------------- calibration sizes
def sized_calibration(registry, base, n) -> str:
    """Name of calibration set `base` of `registry` with nsamples = n: `base` itself when n is
    its own size (its Grams, selections and cells are shared with the tables), else
    `<base>-n<N>`, added to the registry on first use."""
    if int(n) == int(registry[base]["nsamples"]):
        return base
    name = f"{base}-n{n}"
    registry.setdefault(name, dict(registry[base], nsamples=int(n)))
    return name


def add_fig2_calibrations(config) -> None:
    """Add Fig. 2's calibration sets (the base set with nsamples replaced) to the config."""
    if "fig2" in config:
        for n in config["fig2"]["nsamples"]:
            sized_calibration(config["calibration"], config["fig2"]["calibration"], n)


# ----------------------------------------------------------------------------- tables
def table_cfg(config, name) -> dict:
    """A table's config; table2 defaults to table1's cells scored by zero-shot mean7."""
    if name in config:
        return config[name]
    if name == "table2":
        return dict(config["table1"], metric="mean7")
    return config["extra_tables"][name]


def table_file(config, name) -> str:
    """The per-cell result file a table reads: ppl.json or zeroshot.json."""
    if name in TABLE_FILES:
        return TABLE_FILES[name]
    return "zeroshot.json" if table_cfg(config, name)["metric"] != "ppl" else "ppl.json"


def table_spec(config, name, filename) -> dict:
    """The report spec of a table: a dense row, then one row per (ratio, selection, comp); a
    zero-shot table's rows also name the row each is compared with (``with_comparisons``)."""
    t = table_cfg(config, name)
    models = t["models"]
    rows = [
        {
            "labels": {"ratio": 0.0, "selection": "dense", "compensation": "dense"},
            "cells": {m: f"{paths.dense_dir(m)}/{filename}" for m in models},
        }
    ]
    groups = [None]
    for r in t["ratios"]:
        for row in t["rows"]:
            cells = {
                m: f"{cell_dir(m, t['calibration'], row['selection'], r, row['compensation'])}/{filename}"
                for m in models
            }
            rows.append(
                {
                    "labels": {
                        "ratio": float(r),
                        "selection": row["selection"],
                        "compensation": row.get("label", row["compensation"]),
                    },
                    "cells": cells,
                }
            )
            groups.append(((float(r), row["selection"]), row["compensation"], row.get("compare")))
    metric = t["metric"]
    spec = {
        "metric": metric,
        "digits": 2 if metric == "ppl" else 4,
        "models": models,
        "label_columns": ["ratio", "selection", "compensation"],
        "rows": rows,
        "caption": f"{name}: {metric} | calibration {t['calibration']} "
        f"{json.dumps(config['calibration'][t['calibration']])} | evaluation "
        f"{json.dumps(config['evaluation'], sort_keys=True)}",
    }
    return with_comparisons(config, spec, groups, f"{name}.rows")


#: the line a zero-shot table's caption gets: what its ± are
ZEROSHOT_NOISE = (
    "± is one standard error: of a cell's mean over its tasks, the tasks' own "
    "standard errors combined as independent (sqrt(sum SE_t^2) / T); of Δ, the paired "
    "difference to the row named under 'vs' (same ratio) over the documents both "
    "scored, in points"
)


def zeroshot_tasks(metric: str) -> list[str] | None:
    """The tasks a zero-shot table metric averages: the paper's seven for ``mean7``, one task for
    ``tasks.<task>.value``; None for a metric that is not zero-shot accuracy (perplexity)."""
    from .evaluate.tasks import PAPER_TASKS

    if metric == "mean7":
        return list(PAPER_TASKS)
    parts = metric.split(".")
    if len(parts) == 3 and parts[0] == "tasks" and parts[2] == "value":
        return [parts[1]]
    return None


def with_comparisons(config, spec: dict, groups: list, where: str) -> dict:
    """A zero-shot table spec with its noise: each row's ``compare`` (the index of the row it is
    compared with, or None) and, when per-sample records are kept
    (``evaluation.zeroshot_log_samples``), the records of each cell (``samples``), which the
    report pairs document by document. ``groups[i]`` is None for the dense row, else (group key,
    row name, its ``compare`` setting): a row is compared with the row of its group named by
    ``compare``, by default the group's first row (which is compared with nothing). A spec of a
    perplexity table is returned unchanged."""
    tasks = zeroshot_tasks(spec["metric"])
    if tasks is None:
        return spec
    first: dict = {}
    named: dict = {}
    for i, g in enumerate(groups):
        if g is not None:
            first.setdefault(g[0], i)
            named.setdefault((g[0], g[1]), i)
    for i, (row, g) in enumerate(zip(spec["rows"], groups)):
        if g is None:
            row["compare"] = None
            continue
        key, _, compare = g
        if compare is not None and (key, compare) not in named:
            raise ValueError(
                f"config: {where}: compare {compare!r} names no row of the same ratio and "
                f"selection (known: {', '.join(n for k, n in named if k == key)})"
            )
        ref = named[(key, compare)] if compare is not None else first[key]
        row["compare"] = ref if ref != i else None
    paired = {i for i, row in enumerate(spec["rows"]) if row["compare"] is not None}
    paired |= {spec["rows"][i]["compare"] for i in paired}
    # records exist for the configured tasks only; a metric over others has no value to pair
    recorded = config["evaluation"]["zeroshot_log_samples"] and set(tasks) <= set(
        config["evaluation"].get("zeroshot_tasks") or []
    )
    if recorded:
        for i in sorted(paired):  # the rows a paired difference reads, document by document
            spec["rows"][i]["samples"] = {
                m: [f"{os.path.dirname(p)}/zeroshot_samples/{t}.jsonl" for t in tasks]
                for m, p in spec["rows"][i]["cells"].items()
            }
    spec.update(zeroshot_tasks=tasks, paired=bool(recorded), caption=f"{spec['caption']}\n\n{ZEROSHOT_NOISE}")
    return spec


def table_inputs(config, name) -> list[str]:
    """Every result file a table reads."""
    return spec_inputs(table_spec(config, name, table_file(config, name)))


def table4_spec(config) -> dict:
    """The spec of Table 4 (deployment cost of the published architectures and local models)."""
    t = config["table4"]
    return {
        "ratio": t["ratio"],
        "group_rounding": "ceil",
        "published": t.get("published", []),
        "local": {m: str(model_path(config, m)) for m in t.get("models", [])},
        "caption": f"Table 4: deployment cost at {fmt_ratio(t['ratio'])} "
        "column sparsity (ceil rounding of KV groups and channels); params in 1e9, "
        "memory in GiB (bf16 weights + KV cache + one layer's activations at 4096 "
        "tokens), GFLOPs per token = 2 x params",
    }


def table4_inputs(config) -> list[str]:
    """The converted folders of Table 4's embedded models (the others need no workflow output)."""
    return [
        paths.model_dir(m) for m in config["table4"].get("models", []) if config["models"][m]["source"] == "embedded"
    ]


# ----------------------------------------------------------------------------- figures, App. C
def size_figure_spec(panels, seqlen, caption) -> dict:
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


def fig2_spec(config) -> dict:
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


def appc_geometry(config) -> str:
    """The geometry.csv of the App. C cell."""
    c = config["appC"]
    return f"{cell_dir(c['model'], c['calibration'], c['selection'], c['ratio'], c['compensation'])}/geometry.csv"


def appc_caption(config) -> str:
    c = config["appC"]
    return (
        f"App. C geometry: {c['model']}, calibration {c['calibration']}, {c['selection']} "
        f"selection at {fmt_ratio(c['ratio'])}, compensation {c['compensation']} "
        f"({json.dumps(config['compensations'][c['compensation']], sort_keys=True)}); O = original read "
        f"frame on kept coordinates, P = pruned W_K, C = compensated; o_proj r_p=16, down_proj r=64"
    )


def appc_spec(config) -> dict:
    """The spec of the App. C summary table and angle figure."""
    return {"geometry": appc_geometry(config), "caption": appc_caption(config)}


# ----------------------------------------------------------------------------- claims
def claims_spec(config) -> dict:
    """The spec of coec.claims: the configured result files each claim reads."""
    extra = config.get("extra_tables") or {}
    ppl = [paths.table_file("table1")] + [paths.table_file(n) for n, t in extra.items() if t["metric"] == "ppl"]
    zs = [paths.table_file("table2")] + [paths.table_file(n) for n, t in extra.items() if t["metric"] == "mean7"]
    from .extension import extensions

    spec = {
        "ppl_tables": ppl,
        "zeroshot_tables": zs,
        "table3": paths.table_file("table3") if "table3" in config else None,
        "table3_rows": [r["compensation"] for r in config["table3"]["rows"]] if "table3" in config else [],
        "table4": paths.table_file("table4") if "table4" in config else None,
        "appC": paths.table_file("appC") if "appC" in config else None,
        "fig2": fig2_spec(config)["panels"] if "fig2" in config else None,
    }
    for ext in extensions():
        if ext.claims_spec is not None:
            spec.update(ext.claims_spec(config))
    return spec


def claims_inputs(config) -> list[str]:
    """Every result file the claims report reads: each table the spec names, and the cells of
    each figure (a ``{panel: {line: [[N, file], ...]}}`` entry)."""
    files = []
    for key, value in claims_spec(config).items():
        if key.endswith("_tables"):
            files += value
        elif isinstance(value, str):
            files.append(value)
        elif isinstance(value, dict):
            files += figure_inputs({"panels": value})
    return sorted(set(files))


# ----------------------------------------------------------------------------- results/README.md, Snakemake report
def sparsity_words(config, table) -> str:
    """'30 % column sparsity' (or '10 %, 20 % ...') of a table's ratios."""
    return ", ".join(f"{float(r) * 100:g} %" for r in table_cfg(config, table)["ratios"]) + " column sparsity"


def report_items(config) -> list[tuple[str, str, str]]:
    """[(path, title, caption)] of every table and figure the config defines, in paper order;
    tables carry their caption in their .md twin, figures get it here."""
    from .extension import extensions

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
    if "fig2" in config:
        items.append(
            (
                paths.figure_file("fig2_calibration_size"),
                "Fig. 2: perplexity against calibration size",
                fig2_spec(config)["caption"],
            )
        )
    for name, t in (config.get("extra_tables") or {}).items():
        metric = t["metric"]
        items.append(
            (
                paths.table_file(name),
                f"{name}: {METRIC_WORDS.get(metric, metric)} at {sparsity_words(config, name)}",
                "",
            )
        )
    if "appC" in config:
        items += [
            (paths.table_file("appC"), "App. C: geometry summary", ""),
            (paths.figure_file("appC_angles"), "App. C: principal angles per layer", appc_caption(config)),
        ]
    for ext in extensions():
        if ext.report_items is not None:
            items += ext.report_items(config)
    return items


def readme_spec(config, configfiles) -> dict:
    """The spec of results/README.md: the config files (relative to the repository) and every
    table and figure with its title and caption."""
    return {
        "configfiles": " + ".join(configfiles) or "config.yaml",
        "items": [{"path": p, "title": t, "caption": c} for p, t, c in report_items(config)],
    }


def report_label(config, path) -> dict:
    """The label of a table or figure in the Snakemake report: its title (report_items)."""
    titles = {p: t for p, t, _ in report_items(config)}
    return {"artifact": titles.get(path, os.path.basename(path))}


def report_table_kind(config, name) -> str:
    """The subcategory of a table in the report's Tables category: what its numbers are."""
    metric = table_cfg(config, name)["metric"]
    return "Perplexity" if metric == "ppl" else "Zero-shot accuracy"
