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
        expect=lambda wc: model_expect(wc.model, "evaluation.ppl_seqlen"),
        hub=lambda wc: hub_args(wc.model),
    )


# {params.extra}, {params.dmap} and {params.data} hold several words, each shell-quoted where built
PPL_SHELL = (
    "OMP_NUM_THREADS={threads} {PY} ppl --model {params.model:q} --dataset {params.dataset:q} --seqlen {params.seqlen:q} "
    "--max-windows {params.max_windows:q} --batch-size {params.batch:q} --dtype {params.dtype:q} "
    "--device {params.device:q} --expect {params.expect:q} {params.hub} --out {output:q} {params.extra} {params.dmap} "
    "> {log:q} 2>&1"
)


def cell_args(wc, input):
    """--keep, --comp and --cell of an evaluation job, each word shell-quoted."""
    comp = [input.comp] if isinstance(input.comp, str) else list(input.comp)
    return "--keep {} --comp {} --cell {}".format(
        shlex_quote(input.keep), " ".join(shlex_quote(c) for c in comp),
        shlex_quote(json.dumps(dict(wc.items()))))


def device_map_arg(wc):
    dm = model_cfg(wc.model).get("device_map")
    return f"--device-map {shlex_quote(dm)}" if dm else ""


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
        dtype=lambda wc: model_cfg(wc.model).get("dtype", "float32"),
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


def zeroshot_params():
    local = EV.get("zeroshot_source", "local") == "local"
    return dict(
        tasks=list(EV.get("zeroshot_tasks", [])),
        data=f"--data-dir {shlex_quote(ZS_DATA)}" if local else "",
        limit=EV.get("zeroshot_limit") or 0,
        batch=EV.get("zeroshot_batch_size", 16),
        max_length=EV.get("zeroshot_max_length", 2048),
        device=config.get("compute", {}).get("device", "auto"),
        expect=lambda wc: model_expect(wc.model),
        hub=lambda wc: hub_args(wc.model),
        samples="--log-samples" if ZS_LOG_SAMPLES else "--no-log-samples",
    )


ZS_DATA = "resources/zeroshot"
ZS_LOG_SAMPLES = bool(EV.get("zeroshot_log_samples", True))


def zs_outputs(cell_dir):
    """zeroshot.json (the summary the tables read; listed first: the shell's --out) and lm-eval's
    own records next to it: zeroshot_lm_eval.json, zeroshot_samples/<task>.jsonl (docs/zeroshot.md)."""
    out = dict(summary=f"{cell_dir}/zeroshot.json", lm_eval=f"{cell_dir}/zeroshot_lm_eval.json")
    if ZS_LOG_SAMPLES:
        out["samples"] = [f"{cell_dir}/zeroshot_samples/{t}.jsonl"
                          for t in dict.fromkeys(EV.get("zeroshot_tasks", []))]
    return out

ZS_INPUT = [f"{ZS_DATA}/manifest.json"] if EV.get("zeroshot_source", "local") == "local" else []
ZS_SHELL = (
    "OMP_NUM_THREADS={threads} {PY} zeroshot --model {params.model:q} --tasks {params.tasks:q} "
    "{params.data} --limit {params.limit:q} --batch-size {params.batch:q} "
    "--max-length {params.max_length:q} --dtype {params.dtype:q} --device {params.device:q} "
    "--expect {params.expect:q} {params.hub} {params.samples} --out {output[0]:q} {params.extra} {params.dmap} "
    "> {log:q} 2>&1"
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
        dtype=lambda wc: model_cfg(wc.model).get("dtype", "float32"),
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
