# The pruned model as a product (docs/deploy.md, docs/export.md "GGUF"): a GGUF file for llama.cpp
# next to each cell's HF export, for the dense model and for iterative cells too, and the measured
# deployment cost beside Table 4.
#
#   results/{model}/{calib}/{select}-{ratio}/{comp}/export-{gguf_type}.gguf
#   results/{model}/{calib}/iterative/{variant}-{ratio}/export-{gguf_type}.gguf
#   results/{model}/dense/export-{gguf_type}.gguf          (the unpruned model, same writer)
#   results/table4_measured.csv (+ .md, .runs.json), results/figures/table4_measured.png
#
# {gguf_type}: f32 | f16 | q8_0 (q8_0 falls back to f16 per tensor where a row width is not a
# multiple of 32; the file and the log say which).

from coec.cli import GGUF_TYPES
from coec.deploy import spec as deploy_spec

# {params.extra}: --keep, --comp and --cell of the cell (common.smk's cell_args), each word quoted
GGUF_SHELL = (
    "OMP_NUM_THREADS={threads} {PY} export --format gguf --gguf-type {wildcards.gguf_type:q} "
    "--model {params.model:q} {params.hub} --dtype {params.dtype:q} --expect {params.expect:q} "
    "{params.extra} --out {output:q} > {log:q} 2>&1"
)


wildcard_constraints:
    gguf_type="|".join(GGUF_TYPES),


rule export_gguf:
    conda:
        "../../envs/coec.yaml"
    input:
        model=model_input,
        keep="results/{model}/{calib}/{select}-{ratio}/keep.json",
        comp=comp_files,
    output:
        "results/{model}/{calib}/{select}-{ratio}/{comp}/export-{gguf_type}.gguf",
    params:
        model=lambda wc: model_path(wc.model),
        hub=lambda wc: hub_args(wc.model),
        dtype=lambda wc: model_cfg(wc.model)["dtype"],
        expect=lambda wc: model_expect(wc.model),
        extra=cell_args,
    log:
        "results/logs/export/{model}/{calib}/{select}-{ratio}/{comp}-{gguf_type}.log",
    benchmark:
        "results/benchmarks/export/{model}/{calib}/{select}-{ratio}/{comp}-{gguf_type}.tsv"
    threads: job_threads("export")
    resources:
        **export_resources(),
    shell:
        GGUF_SHELL


rule export_gguf_iterative:
    conda:
        "../../envs/coec.yaml"
    input:
        model=model_input,
        keep="results/{model}/{calib}/iterative/{variant}-{ratio}/keep.json",
        comp=it_cell_block,
    output:
        "results/{model}/{calib}/iterative/{variant}-{ratio}/export-{gguf_type}.gguf",
    wildcard_constraints:
        variant=it_alternatives(IT_VARIANTS),
    params:
        model=lambda wc: model_path(wc.model),
        hub=lambda wc: hub_args(wc.model),
        dtype=lambda wc: model_cfg(wc.model)["dtype"],
        expect=lambda wc: model_expect(wc.model),
        extra=cell_args,
    log:
        "results/logs/export/{model}/{calib}/iterative/{variant}-{ratio}-{gguf_type}.log",
    benchmark:
        "results/benchmarks/export/{model}/{calib}/iterative/{variant}-{ratio}-{gguf_type}.tsv"
    threads: job_threads("export")
    resources:
        **export_resources(),
    shell:
        GGUF_SHELL


rule export_gguf_dense:
    conda:
        "../../envs/coec.yaml"
    input:
        model=model_input,
    output:
        "results/{model}/dense/export-{gguf_type}.gguf",
    params:
        model=lambda wc: model_path(wc.model),
        hub=lambda wc: hub_args(wc.model),
        dtype=lambda wc: model_cfg(wc.model)["dtype"],
        expect=lambda wc: model_expect(wc.model),
        extra=lambda wc: f"--cell {shlex_quote(json.dumps(dict(wc.items())))}",
    log:
        "results/logs/export/{model}/dense-{gguf_type}.log",
    benchmark:
        "results/benchmarks/export/{model}/dense-{gguf_type}.tsv"
    threads: job_threads("export")
    resources:
        **export_resources(),
    shell:
        GGUF_SHELL


# Every configuration is measured in processes of its own, interleaved; the job takes every core
# Snakemake gives it (--cores caps it), so nothing else runs beside the measurement.
rule table4_measured:
    conda:
        "../../envs/coec.yaml"
    input:
        lambda wc: deploy_spec.measured_inputs(config),
    output:
        csv="results/table4_measured.csv",
        md="results/table4_measured.md",
        runs="results/table4_measured.runs.json",
        png="results/figures/table4_measured.png",
    params:
        spec=lambda wc: json.dumps(deploy_spec.measured_spec(config)),
    log:
        "results/logs/report/table4_measured.log",
    benchmark:
        "results/benchmarks/report/table4_measured.tsv"
    threads: os.cpu_count() or 1
    resources:
        **rule_resources("report"),
    shell:
        "{PY} report --kind table4-measured --spec {params.spec:q} --out {output.csv:q} > {log:q} 2>&1"
