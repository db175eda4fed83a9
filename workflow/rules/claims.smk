# The claims report: every claim of the two papers beside the figure measured here and a verdict
# (src/coec/claims.py; docs/claims.md). It depends only on the result files of what the config
# defines; a claim whose tables are not configured reads "not testable here" with the reason.


def claims_spec():
    """The spec of coec.claims: the configured result files each claim reads."""
    ppl = ["results/table1.csv"] + [f"results/{n}.csv" for n, t in (config.get("extra_tables") or {}).items()
                                    if t.get("metric", "ppl") == "ppl"]
    zs = ["results/table2.csv"] + [f"results/{n}.csv" for n, t in (config.get("extra_tables") or {}).items()
                                   if t.get("metric", "ppl") == "mean7"]
    return {
        "ppl_tables": ppl,
        "zeroshot_tables": zs,
        "table3": "results/table3.csv" if "table3" in config else None,
        "table3_rows": [r["compensation"] for r in config["table3"]["rows"]] if "table3" in config else [],
        "table4": "results/table4.csv" if "table4" in config else None,
        "appC": "results/appC.csv" if "appC" in config else None,
        "table_iterative": "results/table_iterative.csv" if "table" in IT else None,
        "fig2": fig2_spec()["panels"] if "fig2" in config else None,
        "iterative_size": it_size_spec()["panels"] if "calibration_size" in IT else None,
    }


def claims_inputs():
    spec = claims_spec()
    files = spec["ppl_tables"] + spec["zeroshot_tables"]
    files += [spec[k] for k in ("table3", "table4", "appC", "table_iterative") if spec[k]]
    for key in ("fig2", "iterative_size"):
        if spec[key]:
            files += figure_inputs({"panels": spec[key]})
    return sorted(set(files))


rule claims:
    conda:
        "../../envs/coec.yaml"
    input:
        lambda wc: claims_inputs(),
    output:
        report("results/claims.md", caption="../report/claims.rst", category="Tables",
               subcategory="Claims", labels={"artifact": "Claims of the papers: verdicts"}),
    params:
        spec=lambda wc: json.dumps(claims_spec()),
    log:
        "results/logs/report/claims.log",
    benchmark:
        "results/benchmarks/report/claims.tsv"
    threads: job_threads("report")
    resources:
        **rule_resources("report"),
    shell:
        "OMP_NUM_THREADS={threads} {PY} report --kind claims --spec {params.spec:q} --out {output:q} > {log:q} 2>&1"
