# Deployable checkpoint of one cell: the pruned, compensated model written in the stock
# transformers class that expresses it exactly (config.json records which and why; see
# docs/export.md). Target: results/{model}/{calib}/{select}-{ratio}/{comp}/export


rule export:
    conda:
        "../../envs/coec.yaml"
    input:
        model=W.model_input,
        keep=rules.select.output[0],
        comp=W.comp_files,
    output:
        directory(paths.export_dir(CELL)),
    params:
        model=W.model_path,
        hub=W.hub,
        dtype=W.model_dtype,
        cell=lambda wc: json.dumps(dict(wc.items())),
        expect=W.expect,
        **W.plugin_params("export"),
    log:
        paths.log_file("export", CELL_LOG),
    benchmark:
        paths.benchmark_file("export", CELL_LOG)
    threads: W.threads("export")
    resources:
        **W.export_resources(),
    shell:
        "OMP_NUM_THREADS={threads} {PY} export --model {params.model:q} {params.hub} "
        "--keep {input.keep:q} --comp {input.comp:q} --dtype {params.dtype:q} --cell {params.cell:q} "
        "--expect {params.expect:q} --out {output:q} > {log:q} 2>&1"
