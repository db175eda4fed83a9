# Tables: results/table1.csv (+ .md twin) and friends, assembled from per-cell JSON files.


def table_cfg(name):
    """A table's config; table2 defaults to table1's cells scored by zero-shot mean7."""
    if name in config:
        return config[name]
    if name == "table2":
        return dict(config["table1"], metric="mean7")
    return config["extra_tables"][name]


def table_spec(name, filename):
    """The report spec of a table: a dense row, then one row per (ratio, selection, comp)."""
    t = table_cfg(name)
    models = t["models"]
    rows = [{"labels": {"ratio": 0.0, "selection": "dense", "compensation": "dense"},
             "cells": {m: f"results/{m}/dense/{filename}" for m in models}}]
    for r in t["ratios"]:
        for row in t["rows"]:
            cells = {m: f"{cell_dir(m, t['calibration'], row['selection'], r, row['compensation'])}/{filename}"
                     for m in models}
            rows.append({"labels": {"ratio": float(r), "selection": row["selection"],
                                    "compensation": row.get("label", row["compensation"])},
                         "cells": cells})
    metric = t.get("metric", "ppl")
    return {"metric": metric, "digits": 2 if metric == "ppl" else 4, "models": models,
            "label_columns": ["ratio", "selection", "compensation"], "rows": rows,
            "caption": f"{name}: {metric} | calibration {t['calibration']} "
                       f"{json.dumps(config['calibration'][t['calibration']])} | evaluation "
                       f"{json.dumps(config['evaluation'], sort_keys=True)}"}


def table_inputs(name, filename):
    spec = table_spec(name, filename)
    return sorted({p for row in spec["rows"] for p in row["cells"].values()})


TABLE_FILES = {"table1": "ppl.json", "table2": "zeroshot.json", "table3": "ppl.json"}


def table_file(name):
    if name in TABLE_FILES:
        return TABLE_FILES[name]
    return "zeroshot.json" if table_cfg(name).get("metric", "ppl") != "ppl" else "ppl.json"


rule table:
    conda:
        "../../envs/coec.yaml"
    input:
        lambda wc: table_inputs(wc.table, table_file(wc.table)),
    output:
        csv=report("results/{table}.csv", caption="../report/table.rst", category="Tables",
                   subcategory=lambda wc: report_table_kind(wc.table),
                   labels=lambda wc: report_label(f"results/{wc.table}.csv")),
        md="results/{table}.md",
    wildcard_constraints:
        table=r"table[123]|" + "|".join(config.get("extra_tables", {}) or ["table_none"]),
    params:
        spec=lambda wc: json.dumps(table_spec(wc.table, table_file(wc.table))),
    log:
        "results/logs/report/{table}.log",
    benchmark:
        "results/benchmarks/report/{table}.tsv"
    threads: job_threads("report")
    resources:
        **rule_resources("report"),
    shell:
        "OMP_NUM_THREADS={threads} {PY} report --kind table --spec {params.spec:q} --out {output.csv:q} > {log:q} 2>&1"


def report_items():
    """[(path, title, caption)] of every table and figure the config defines, in paper order;
    tables carry their caption in their .md twin, figures get it here."""
    items = [("results/table1.csv", f"Table 1: perplexity at {sparsity_words('table1')}", ""),
             ("results/table2.csv",
              f"Table 2: zero-shot mean accuracy (7 tasks) at {sparsity_words('table2')}", "")]
    if "table3" in config:
        items.append(("results/table3.csv", "Table 3: ablation ladder (perplexity)", ""))
    if "table4" in config:
        items.append(("results/table4.csv", "Table 4: deployment cost", ""))
    if "fig2" in config:
        items.append(("results/figures/fig2_calibration_size.png",
                      "Fig. 2: perplexity against calibration size", fig2_spec()["caption"]))
    for name, t in (config.get("extra_tables") or {}).items():
        metric = t.get("metric", "ppl")
        items.append((f"results/{name}.csv",
                      f"{name}: {METRIC_WORDS.get(metric, metric)} at {sparsity_words(name)}", ""))
    if "appC" in config:
        items += [("results/appC.csv", "App. C: geometry summary", ""),
                  ("results/figures/appC_angles.png", "App. C: principal angles per layer",
                   appc_caption())]
    if "table" in IT:
        items += [("results/table_iterative.csv", "Iterative multi-domain FLAP: perplexity", ""),
                  ("results/table_iterative_zeroshot.csv",
                   "Iterative multi-domain FLAP: zero-shot mean accuracy (7 tasks)", "")]
    if "calibration_size" in IT:
        items.append(("results/figures/iterative_calibration_size.png",
                      "Iterative multi-domain FLAP: perplexity against calibration size",
                      it_size_spec()["caption"]))
    return items


# ----------------------------------------------------------------------------- Snakemake report
# `snakemake --report report.html <targets>` (docs/report.md): the report() outputs of the table,
# figure and geometry rules, with captions in workflow/report/ and these labels and subcategories.
METRIC_WORDS = {"ppl": "perplexity", "mean7": "zero-shot mean accuracy (7 tasks)"}


def sparsity_words(table):
    """'30 % column sparsity' (or '10 %, 20 % ...') of a table's ratios."""
    return ", ".join(f"{float(r) * 100:g} %" for r in table_cfg(table)["ratios"]) + " column sparsity"


def report_label(path):
    """The label of a table or figure in the Snakemake report: its title (report_items)."""
    titles = {p: t for p, t, _ in report_items()}
    return {"artifact": titles.get(path, os.path.basename(path))}


def report_table_kind(name):
    """The subcategory of a table in the report's Tables category: what its numbers are."""
    metric = table_cfg(name).get("metric", "ppl")
    return "Perplexity" if metric == "ppl" else "Zero-shot accuracy"


rule report_readme:
    conda:
        "../../envs/coec.yaml"
    input:
        lambda wc: [p for p, _, _ in report_items()],
    output:
        "results/README.md",
    params:
        spec=lambda wc: json.dumps({
            "configfiles": " + ".join(os.path.relpath(f, workflow.basedir)
                                      for f in workflow.configfiles) or "config.yaml",
            "items": [{"path": p, "title": t, "caption": c} for p, t, c in report_items()]}),
    log:
        "results/logs/report/readme.log",
    benchmark:
        "results/benchmarks/report/readme.tsv"
    resources:
        **rule_resources("report"),
    shell:
        "{PY} report --kind readme --spec {params.spec:q} --out {output:q} > {log:q} 2>&1"
