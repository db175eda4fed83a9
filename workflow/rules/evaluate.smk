# Perplexity (and zero-shot accuracy) of the dense model and of every pruned/compensated cell.
# The pruned model is assembled in memory from keep.json and the per-block weights.

EV = config["evaluation"]


def ppl_params():
    return dict(
        dataset=json.dumps(dataset_spec(EV["ppl_dataset"])),
        seqlen=EV["ppl_seqlen"],
        max_windows=EV.get("ppl_max_windows") or 0,
        batch=EV.get("ppl_batch_size", 4),
        device=config.get("compute", {}).get("device", "auto"),
    )


PPL_SHELL = (
    "OMP_NUM_THREADS={threads} {PY} ppl --model {params.model:q} --dataset {params.dataset:q} --seqlen {params.seqlen} "
    "--max-windows {params.max_windows} --batch-size {params.batch} --dtype {params.dtype} "
    "--device {params.device} --out {output} {params.extra} {params.dmap} > {log} 2>&1"
)


def device_map_arg(wc):
    dm = model_cfg(wc.model).get("device_map")
    return f"--device-map {dm}" if dm else ""


rule ppl_dense:
    input:
        model=model_input,
        text=dataset_input(EV["ppl_dataset"]),
    output:
        "results/{model}/dense/ppl.json",
    params:
        model=lambda wc: model_path(wc.model),
        dtype=lambda wc: model_cfg(wc.model).get("dtype", "float32"),
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
    input:
        model=model_input,
        text=dataset_input(EV["ppl_dataset"]),
        keep="results/{model}/{calib}/{select}-{ratio}/keep.json",
        comp=comp_files,
    output:
        "results/{model}/{calib}/{select}-{ratio}/{comp}/ppl.json",
    params:
        model=lambda wc: model_path(wc.model),
        dtype=lambda wc: model_cfg(wc.model).get("dtype", "float32"),
        dmap=device_map_arg,
        extra=lambda wc, input: "--keep {} --comp {} --cell {}".format(
            input.keep, " ".join(input.comp),
            shlex_quote(json.dumps(dict(wc.items())))),
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


def zeroshot_params():
    local = EV.get("zeroshot_source", "local") == "local"
    return dict(
        tasks=" ".join(EV.get("zeroshot_tasks", [])),
        data=f"--data-dir {ZS_DATA}" if local else "",
        limit=EV.get("zeroshot_limit") or 0,
        batch=EV.get("zeroshot_batch_size", 16),
        max_length=EV.get("zeroshot_max_length", 2048),
        device=config.get("compute", {}).get("device", "auto"),
    )


ZS_DATA = "resources/zeroshot"
ZS_INPUT = [f"{ZS_DATA}/manifest.json"] if EV.get("zeroshot_source", "local") == "local" else []
ZS_SHELL = (
    "OMP_NUM_THREADS={threads} {PY} zeroshot --model {params.model:q} --tasks {params.tasks} "
    "{params.data} --limit {params.limit} --batch-size {params.batch} "
    "--max-length {params.max_length} --dtype {params.dtype} --device {params.device} "
    "--out {output} {params.extra} {params.dmap} > {log} 2>&1"
)


rule zeroshot_dense:
    input:
        model=model_input,
        data=ZS_INPUT,
    output:
        "results/{model}/dense/zeroshot.json",
    params:
        model=lambda wc: model_path(wc.model),
        dtype=lambda wc: model_cfg(wc.model).get("dtype", "float32"),
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
    input:
        model=model_input,
        data=ZS_INPUT,
        keep="results/{model}/{calib}/{select}-{ratio}/keep.json",
        comp=comp_files,
    output:
        "results/{model}/{calib}/{select}-{ratio}/{comp}/zeroshot.json",
    params:
        model=lambda wc: model_path(wc.model),
        dtype=lambda wc: model_cfg(wc.model).get("dtype", "float32"),
        dmap=device_map_arg,
        extra=lambda wc, input: "--keep {} --comp {} --cell {}".format(
            input.keep, " ".join(input.comp), shlex_quote(json.dumps(dict(wc.items())))),
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
