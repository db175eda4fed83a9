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
    input:
        lambda wc: table_inputs(wc.table, table_file(wc.table)),
    output:
        csv="results/{table}.csv",
        md="results/{table}.md",
    wildcard_constraints:
        table=r"table[123]|" + "|".join(config.get("extra_tables", {}) or ["table_none"]),
    params:
        spec=lambda wc: json.dumps(table_spec(wc.table, table_file(wc.table))),
    log:
        "results/logs/report/{table}.log",
    benchmark:
        "results/benchmarks/report/{table}.tsv"
    threads: THREADS
    resources:
        **rule_resources("report"),
    shell:
        "OMP_NUM_THREADS={threads} {PY} report --kind table --spec {params.spec:q} --out {output.csv} > {log} 2>&1"


REPORT_ITEMS = [
    ("results/table1.csv", "Table 1: perplexity at the table1 ratios"),
    ("results/table2.csv", "Table 2: zero-shot mean accuracy (7 tasks)"),
    ("results/table3.csv", "Table 3: ablation ladder (perplexity)"),
    ("results/table4.csv", "Table 4: deployment cost"),
    ("results/appC.csv", "App. C: geometry summary"),
    ("results/figures/appC_angles.png", "App. C: principal angles per layer"),
]


rule report_readme:
    input:
        [p for p, _ in REPORT_ITEMS],
    output:
        "results/README.md",
    params:
        spec=lambda wc: json.dumps({
            "configfiles": " + ".join(os.path.relpath(f, workflow.basedir)
                                      for f in workflow.configfiles) or "config.yaml",
            "items": [{"path": p, "title": t,
                       "caption": appc_caption() if p.endswith(".png") else ""}
                      for p, t in REPORT_ITEMS]}),
    log:
        "results/logs/report/readme.log",
    benchmark:
        "results/benchmarks/report/readme.tsv"
    resources:
        **rule_resources("report"),
    shell:
        "{PY} report --kind readme --spec {params.spec:q} --out {output} > {log} 2>&1"
