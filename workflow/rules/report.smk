# Tables and figures (results/<table>.csv + .md twin, results/figures/*.png) and the claims report,
# each assembled from per-cell result files by `coec report --kind <kind>` from a spec of
# coec.targets: one rule (`table`), its variants by `use rule ... with:`.


rule table:
    conda:
        "../../envs/coec.yaml"
    input:
        lambda wc: targets.table_inputs(config, wc.table),
    output:
        main=report(paths.table_file("{table}"), caption="../report/table.rst", category="Tables",
                   subcategory=lambda wc: targets.report_table_kind(config, wc.table),
                   labels=lambda wc: targets.report_label(config, paths.table_file(wc.table))),
        md=paths.table_file("{table}", "md"),
    wildcard_constraints:
        table=W.table_names(),
    params:
        kind="table",
        spec=lambda wc: json.dumps(targets.table_spec(config, wc.table, targets.table_file(config, wc.table))),
    log:
        paths.log_file("report", "{table}"),
    benchmark:
        paths.benchmark_file("report", "{table}")
    threads: W.threads("report")
    resources:
        **W.rule_resources("report"),
    shell:
        "OMP_NUM_THREADS={threads} {PY} report --kind {params.kind:q} --spec {params.spec:q} --out {output.main:q} > {log:q} 2>&1"


use rule table as table4 with:
    input:
        lambda wc: targets.table4_inputs(config),
    output:
        main=report(paths.table_file("table4"), caption="../report/table4.rst", category="Tables",
                   subcategory="Deployment cost", labels=lambda wc: targets.report_label(config, paths.table_file("table4"))),
        md=paths.table_file("table4", "md"),
    params:
        kind="table4",
        spec=lambda wc: json.dumps(targets.table4_spec(config)),
    log:
        paths.log_file("report", "table4"),
    benchmark:
        paths.benchmark_file("report", "table4")


use rule table as fig2 with:
    input:
        lambda wc: targets.figure_inputs(targets.fig2_spec(config)),
    output:
        main=report(paths.figure_file("fig2_calibration_size"), caption="../report/fig2.rst", category="Figures",
               labels=lambda wc: targets.report_label(config, paths.figure_file("fig2_calibration_size"))),
    params:
        kind="lines-figure",
        spec=lambda wc: json.dumps(targets.fig2_spec(config)),
    log:
        paths.log_file("report", "fig2"),
    benchmark:
        paths.benchmark_file("report", "fig2")


# The claims report: every claim of the papers beside the figure measured here and a verdict
# (coec.claims; docs/claims.md); a claim whose tables are not configured reads "not testable here".
use rule table as claims with:
    input:
        lambda wc: targets.claims_inputs(config),
    output:
        main=report(f"{paths.RESULTS}/claims.md", caption="../report/claims.rst", category="Tables",
               subcategory="Claims", labels={"artifact": "Claims of the papers: verdicts"}),
    params:
        kind="claims",
        spec=lambda wc: json.dumps(targets.claims_spec(config)),
    log:
        paths.log_file("report", "claims"),
    benchmark:
        paths.benchmark_file("report", "claims")


# `snakemake --report report.html <targets>` (docs/report.md): the report() outputs of the table,
# figure and App. C rules, with captions in workflow/report/ and the labels and subcategories of
# coec.targets (report_label, report_table_kind; titles in paper order: report_items).
use rule table as report_readme with:
    input:
        lambda wc: [p for p, _, _ in targets.report_items(config)],
    output:
        main=f"{paths.RESULTS}/README.md",
    params:
        kind="readme",
        spec=lambda wc: json.dumps(targets.readme_spec(
            config, [os.path.relpath(f, workflow.basedir) for f in workflow.configfiles])),
    log:
        paths.log_file("report", "readme"),
    benchmark:
        paths.benchmark_file("report", "readme")
