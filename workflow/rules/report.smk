# Tables: results/table1.csv (+ .md twin) and friends, assembled from per-cell JSON files.


rule table:
    conda:
        "../../envs/coec.yaml"
    input:
        lambda wc: targets.table_inputs(config, wc.table),
    output:
        csv=report("results/{table}.csv", caption="../report/table.rst", category="Tables",
                   subcategory=lambda wc: targets.report_table_kind(config, wc.table),
                   labels=lambda wc: targets.report_label(config, f"results/{wc.table}.csv")),
        md="results/{table}.md",
    wildcard_constraints:
        table=r"table[123]|" + "|".join(config.get("extra_tables", {}) or ["table_none"]),
    params:
        spec=lambda wc: json.dumps(targets.table_spec(config, wc.table, targets.table_file(config, wc.table))),
    log:
        "results/logs/report/{table}.log",
    benchmark:
        "results/benchmarks/report/{table}.tsv"
    threads: job_threads("report")
    resources:
        **rule_resources("report"),
    shell:
        "OMP_NUM_THREADS={threads} {PY} report --kind table --spec {params.spec:q} --out {output.csv:q} > {log:q} 2>&1"


# `snakemake --report report.html <targets>` (docs/report.md): the report() outputs of the table,
# figure and geometry rules, with captions in workflow/report/ and the labels and subcategories of
# coec.targets (report_label, report_table_kind; titles in paper order: report_items).


rule report_readme:
    conda:
        "../../envs/coec.yaml"
    input:
        lambda wc: [p for p, _, _ in targets.report_items(config)],
    output:
        "results/README.md",
    params:
        spec=lambda wc: json.dumps(targets.readme_spec(
            config, [os.path.relpath(f, workflow.basedir) for f in workflow.configfiles])),
    log:
        "results/logs/report/readme.log",
    benchmark:
        "results/benchmarks/report/readme.tsv"
    resources:
        **rule_resources("report"),
    shell:
        "{PY} report --kind readme --spec {params.spec:q} --out {output:q} > {log:q} 2>&1"
