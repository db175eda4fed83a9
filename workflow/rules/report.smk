# Tables: results/table1.csv (+ .md twin) and friends, assembled from per-cell JSON files.


def table_spec(name, filename):
    """The report spec of a table: a dense row, then one row per (ratio, selection, comp)."""
    t = config[name] if name in config else config["extra_tables"][name]
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
    return {"metric": t.get("metric", "ppl"), "digits": 2, "models": models,
            "label_columns": ["ratio", "selection", "compensation"], "rows": rows,
            "caption": f"{name}: {t.get('metric', 'ppl')} | calibration {t['calibration']} "
                       f"{json.dumps(config['calibration'][t['calibration']])} | evaluation "
                       f"{json.dumps(config['evaluation'], sort_keys=True)}"}


def table_inputs(name, filename):
    spec = table_spec(name, filename)
    return sorted({p for row in spec["rows"] for p in row["cells"].values()})


rule table1:
    input:
        lambda wc: table_inputs("table1", "ppl.json"),
    output:
        csv="results/table1.csv",
        md="results/table1.md",
    params:
        spec=lambda wc: json.dumps(table_spec("table1", "ppl.json")),
    log:
        "results/logs/report/table1.log",
    benchmark:
        "results/benchmarks/report/table1.tsv"
    resources:
        **rule_resources("report"),
    shell:
        "{PY} report --kind table --spec {params.spec:q} --out {output.csv} > {log} 2>&1"
