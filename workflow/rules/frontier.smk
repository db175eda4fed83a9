# Pruned or quantized? The size-quality-speed frontier in llama.cpp (docs/frontier.md): the dense
# model and each `frontier.rows` entry at every ratio, each GGUF type's file size, its perplexity in
# llama.cpp (ppl-gguf-{type}.json) and its speed. Included after deploy.smk (its exports and
# perplexity rules make the inputs).
#
#   results/frontier_speed.csv (+ .md, .runs.json), results/figures/frontier_speed.png
#   results/frontier.csv (+ .md), results/figures/frontier.png
from coec.report import frontier


# The speed of every (cell, type) in processes of their own, interleaved (the measured-table
# harness); the job takes every core Snakemake gives it, so nothing else runs beside it.
rule frontier_speed:
    conda:
        "../../envs/coec.yaml"
    input:
        lambda wc: frontier.speed_inputs(W.config),
    output:
        csv=paths.table_file(frontier.SPEED),
        md=paths.table_file(frontier.SPEED, "md"),
        runs=paths.table_file(frontier.SPEED, "runs.json"),
        png=paths.figure_file(frontier.SPEED),
    params:
        spec=lambda wc: json.dumps(frontier.speed_spec(W.config)),
    log:
        paths.log_file("report", frontier.SPEED),
    benchmark:
        paths.benchmark_file("report", frontier.SPEED)
    threads: os.cpu_count() or 1
    resources:
        **W.rule_resources("report"),
    shell:
        "{PY} report --kind table4-measured --spec {params.spec:q} --out {output.csv:q} > {log:q} 2>&1"


rule frontier:
    conda:
        "../../envs/coec.yaml"
    input:
        lambda wc: frontier.frontier_inputs(W.config),
    output:
        csv=paths.table_file(frontier.KEY),
        md=paths.table_file(frontier.KEY, "md"),
        png=paths.figure_file(frontier.KEY),
    params:
        spec=lambda wc: json.dumps(frontier.frontier_spec(W.config)),
    log:
        paths.log_file("report", frontier.KEY),
    benchmark:
        paths.benchmark_file("report", frontier.KEY)
    threads: W.threads("report")
    resources:
        **W.rule_resources("report"),
    shell:
        "{PY} report --kind frontier --spec {params.spec:q} --out {output.csv:q} > {log:q} 2>&1"
