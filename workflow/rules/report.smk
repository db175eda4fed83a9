# Tables and figures (results/<table>.csv + .md twin, results/figures/*.png) and the claims report,
# each assembled from per-cell result files by `coec report --kind <kind>` from a spec of
# coec.workflow.targets: one rule (`table`), its variants by `use rule ... with:`.


rule table:
    conda:
        "../../envs/coec.yaml"
    input:
        lambda wc: targets.table_inputs(W.config, wc.table),
    output:
        main=report_output(paths.table_file("{table}"), "table.rst", "Tables",
                           lambda wc: targets.report_table_kind(W.config, wc.table)),
        md=paths.table_file("{table}", "md"),
    wildcard_constraints:
        table=W.table_constraint(),
    params:
        kind="table",
        spec=lambda wc: json.dumps(targets.table_spec(W.config, wc.table, targets.table_file(W.config, wc.table))),
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
        lambda wc: targets.table4_inputs(W.config),
    output:
        main=report_output(paths.table_file("table4"), "table4.rst", "Tables", "Deployment cost"),
        md=paths.table_file("table4", "md"),
    params:
        kind="table4",
        spec=lambda wc: json.dumps(targets.table4_spec(W.config)),
    log:
        paths.log_file("report", "table4"),
    benchmark:
        paths.benchmark_file("report", "table4")


use rule table as fig2 with:
    input:
        lambda wc: targets.figure_inputs(targets.fig2_spec(W.config)),
    output:
        main=report_output(paths.figure_file("fig2_calibration_size"), "fig2.rst", "Figures"),
    params:
        kind="lines-figure",
        spec=lambda wc: json.dumps(targets.fig2_spec(W.config)),
    log:
        paths.log_file("report", "fig2"),
    benchmark:
        paths.benchmark_file("report", "fig2")


# The state of the art at one budget (coec.report.sota; docs/sota.md): realised prunable parameters,
# perplexity, KL to the dense model and zero-shot mean of each row's cell.
use rule table as table_sota with:
    input:
        lambda wc: targets.sota_inputs(W.config),
    output:
        main=report_output(paths.table_file("table_sota"), "table_sota.rst", "Tables", "State of the art"),
        md=paths.table_file("table_sota", "md"),
    params:
        kind="sota",
        spec=lambda wc: json.dumps(targets.sota_spec(W.config)),
    log:
        paths.log_file("report", "table_sota"),
    benchmark:
        paths.benchmark_file("report", "table_sota")


# The claims report: every claim of the papers beside the figure measured here and a verdict
# (coec.report.claims; docs/claims.md); a claim whose tables are not configured reads "not testable here".
use rule table as claims with:
    input:
        lambda wc: targets.claims_inputs(W.config),
    output:
        main=report_output(f"{paths.RESULTS}/claims.md", "claims.rst", "Tables", "Claims",
                           labels={"artifact": "Claims of the papers: verdicts"}),
    params:
        kind="claims",
        spec=lambda wc: json.dumps(targets.claims_spec(W.config)),
    log:
        paths.log_file("report", "claims"),
    benchmark:
        paths.benchmark_file("report", "claims")


# `snakemake --report report.html <targets>` (docs/report.md): the report() outputs of the table,
# figure and App. C rules, with captions in workflow/report/ and the labels and subcategories of
# coec.workflow.targets.report_labels (titles in paper order), each through report_output (common.smk).
use rule table as report_readme with:
    input:
        lambda wc: [p for p, _, _ in targets.report_items(W.config)],
    output:
        main=f"{paths.RESULTS}/README.md",
    params:
        kind="readme",
        spec=lambda wc: json.dumps(
            targets.readme_spec(W.config, [os.path.relpath(f, workflow.basedir) for f in workflow.configfiles])
        ),
    log:
        paths.log_file("report", "readme"),
    benchmark:
        paths.benchmark_file("report", "readme")
