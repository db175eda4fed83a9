# Perplexity (and zero-shot accuracy) of the dense model and of every pruned/compensated cell.
# The pruned model is assembled in memory from keep.json and the per-block weights.

# {params.extra}, {params.dmap}, {params.data} and {params.stream} hold several words, each shell-quoted where built
PPL_SHELL = (
    "OMP_NUM_THREADS={threads} {PY} ppl --model {params.model:q} --dataset {params.dataset:q} --seqlen {params.seqlen:q} "
    "--max-windows {params.max_windows:q} --batch-size {params.batch:q} --dtype {params.dtype:q} "
    "--device {params.device:q} --expect {params.expect:q} {params.hub} --out {output:q} {params.extra} {params.dmap} "
    "{params.stream} > {log:q} 2>&1"
)


rule ppl_dense:
    conda:
        "../../envs/coec.yaml"
    input:
        model=model_input,
        text=dataset_input(EV["ppl_dataset"]),
    output:
        "results/{model}/dense/ppl.json",
    params:
        model=lambda wc: model_path(wc.model),
        dtype=lambda wc: model_cfg(wc.model)["dtype"],
        dmap=device_map_arg,
        extra="",
        **ppl_params(),
    log:
        "results/logs/ppl/{model}/dense.log",
    benchmark:
        "results/benchmarks/ppl/{model}/dense.tsv"
    threads: job_threads("ppl")
    resources:
        **rule_resources("ppl"),
    shell:
        PPL_SHELL


rule ppl_cell:
    conda:
        "../../envs/coec.yaml"
    input:
        model=model_input,
        text=dataset_input(EV["ppl_dataset"]),
        keep="results/{model}/{calib}/{select}-{ratio}/keep.json",
        comp=comp_files,
    output:
        "results/{model}/{calib}/{select}-{ratio}/{comp}/ppl.json",
    params:
        model=lambda wc: model_path(wc.model),
        dtype=lambda wc: model_cfg(wc.model)["dtype"],
        dmap=device_map_arg,
        extra=lambda wc, input: cell_args(wc, input),
        **ppl_params(),
    log:
        "results/logs/ppl/{model}/{calib}/{select}-{ratio}/{comp}.log",
    benchmark:
        "results/benchmarks/ppl/{model}/{calib}/{select}-{ratio}/{comp}.tsv"
    threads: job_threads("ppl")
    resources:
        **rule_resources("ppl"),
    shell:
        PPL_SHELL


ZS_SHELL = (
    "OMP_NUM_THREADS={threads} {PY} zeroshot --model {params.model:q} --tasks {params.tasks:q} "
    "{params.data} --limit {params.limit:q} --batch-size {params.batch:q} "
    "--max-length {params.max_length:q} --dtype {params.dtype:q} --device {params.device:q} "
    "--expect {params.expect:q} {params.hub} {params.samples} --out {output[0]:q} {params.extra} {params.dmap} "
    "{params.stream} > {log:q} 2>&1"
)


rule zeroshot_dense:
    conda:
        "../../envs/coec.yaml"
    input:
        model=model_input,
        data=ZS_INPUT,
    output:
        **zs_outputs("results/{model}/dense"),
    params:
        model=lambda wc: model_path(wc.model),
        dtype=lambda wc: model_cfg(wc.model)["dtype"],
        dmap=device_map_arg,
        extra="",
        **zeroshot_params(),
    log:
        "results/logs/zeroshot/{model}/dense.log",
    benchmark:
        "results/benchmarks/zeroshot/{model}/dense.tsv"
    threads: job_threads("zeroshot")
    resources:
        **rule_resources("zeroshot"),
    shell:
        ZS_SHELL


rule zeroshot_cell:
    conda:
        "../../envs/coec.yaml"
    input:
        model=model_input,
        data=ZS_INPUT,
        keep="results/{model}/{calib}/{select}-{ratio}/keep.json",
        comp=comp_files,
    output:
        **zs_outputs("results/{model}/{calib}/{select}-{ratio}/{comp}"),
    params:
        model=lambda wc: model_path(wc.model),
        dtype=lambda wc: model_cfg(wc.model)["dtype"],
        dmap=device_map_arg,
        extra=lambda wc, input: cell_args(wc, input),
        **zeroshot_params(),
    log:
        "results/logs/zeroshot/{model}/{calib}/{select}-{ratio}/{comp}.log",
    benchmark:
        "results/benchmarks/zeroshot/{model}/{calib}/{select}-{ratio}/{comp}.tsv"
    threads: job_threads("zeroshot")
    resources:
        **rule_resources("zeroshot"),
    shell:
        ZS_SHELL
