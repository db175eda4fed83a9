# The claims report: every claim of the two papers beside the figure measured here and a verdict
# (src/coec/claims.py; docs/claims.md). It depends only on the result files of what the config
# defines; a claim whose tables are not configured reads "not testable here" with the reason.


rule claims:
    conda:
        "../../envs/coec.yaml"
    input:
        lambda wc: targets.claims_inputs(config),
    output:
        report("results/claims.md", caption="../report/claims.rst", category="Tables",
               subcategory="Claims", labels={"artifact": "Claims of the papers: verdicts"}),
    params:
        spec=lambda wc: json.dumps(targets.claims_spec(config)),
    log:
        "results/logs/report/claims.log",
    benchmark:
        "results/benchmarks/report/claims.tsv"
    threads: job_threads("report")
    resources:
        **rule_resources("report"),
    shell:
        "OMP_NUM_THREADS={threads} {PY} report --kind claims --spec {params.spec:q} --out {output:q} > {log:q} 2>&1"
