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
    "{PY} ppl --model {params.model:q} --dataset {params.dataset:q} --seqlen {params.seqlen} "
    "--max-windows {params.max_windows} --batch-size {params.batch} --dtype {params.dtype} "
    "--device {params.device} --out {output} {params.extra} > {log} 2>&1"
)


rule ppl_dense:
    input:
        model=model_input,
        text=dataset_input(EV["ppl_dataset"]),
    output:
        "results/{model}/dense/ppl.json",
    params:
        model=lambda wc: model_path(wc.model),
        dtype=lambda wc: model_cfg(wc.model).get("dtype", "float32"),
        extra="",
        **ppl_params(),
    log:
        "results/logs/ppl/{model}/dense.log",
    benchmark:
        "results/benchmarks/ppl/{model}/dense.tsv"
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
        extra=lambda wc, input: "--keep {} --comp {} --cell {}".format(
            input.keep, " ".join(input.comp),
            shlex_quote(json.dumps(dict(wc.items())))),
        **ppl_params(),
    log:
        "results/logs/ppl/{model}/{calib}/{select}-{ratio}/{comp}.log",
    benchmark:
        "results/benchmarks/ppl/{model}/{calib}/{select}-{ratio}/{comp}.tsv"
    resources:
        **rule_resources("ppl"),
    shell:
        PPL_SHELL
