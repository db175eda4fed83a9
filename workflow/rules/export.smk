# Deployable checkpoint of one cell: the pruned, compensated model written in the stock
# transformers class that expresses it exactly (config.json records which and why; see
# docs/export.md). Target: results/{model}/{calib}/{select}-{ratio}/{comp}/export


rule export:
    conda:
        "../../envs/coec.yaml"
    input:
        model=model_input,
        keep="results/{model}/{calib}/{select}-{ratio}/keep.json",
        comp=comp_files,
    output:
        directory("results/{model}/{calib}/{select}-{ratio}/{comp}/export"),
    params:
        model=lambda wc: model_path(wc.model),
        hub=lambda wc: hub_args(wc.model),
        dtype=lambda wc: model_cfg(wc.model)["dtype"],
        cell=lambda wc: json.dumps(dict(wc.items())),
        expect=lambda wc: model_expect(wc.model),
    log:
        "results/logs/export/{model}/{calib}/{select}-{ratio}/{comp}.log",
    benchmark:
        "results/benchmarks/export/{model}/{calib}/{select}-{ratio}/{comp}.tsv"
    threads: job_threads("export")
    resources:
        **export_resources(),
    shell:
        "OMP_NUM_THREADS={threads} {PY} export --model {params.model:q} {params.hub} "
        "--keep {input.keep:q} --comp {input.comp:q} --dtype {params.dtype:q} --cell {params.cell:q} "
        "--expect {params.expect:q} --out {output:q} > {log:q} 2>&1"
