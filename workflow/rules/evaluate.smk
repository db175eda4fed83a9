# Perplexity (and zero-shot accuracy) of the dense model and of every pruned/compensated cell: one
# rule per stage for the dense model, its variants for a cell (`use rule ... with:`) add the keep
# set and the compensated blocks. The model streams one layer at a time (docs/streaming.md): the
# streaming options are resources, not params, since they change memory, never a result.

# {params.command}, {params.extra}, {params.dmap} and {params.data} hold several words, each
# shell-quoted where built


# The dense model's top-k log-probabilities and samples of the rest over the perplexity windows
# (docs/kl.md), made once per
# model and read by every perplexity job of it (transformers and llama.cpp), which then reports its
# mean token KL to the dense model; the file records the windows' digest, checked by each reader.
#
#   results/{model}/dense/kl-reference.safetensors
rule kl_reference:
    conda:
        "../../envs/coec.yaml"
    input:
        model=W.model_input,
        text=W.dataset_input(W.evaluation["ppl_dataset"]),
    output:
        paths.kl_reference_file("{model}"),
    params:
        model=W.model_path,
        dtype=W.model_dtype,
        dmap=W.device_map,
        top_k=W.config["kl_top_k"],
        tail=W.config["kl_tail_samples"],
        **W.ppl_params(),
        **W.plugin_params("ppl"),
    log:
        paths.log_file("kl_reference", "{model}", "dense"),
    benchmark:
        paths.benchmark_file("kl_reference", "{model}", "dense")
    threads: W.threads("ppl")
    resources:
        **W.rule_resources("ppl"),
        **W.stream_resources("ppl"),
    shell:
        "OMP_NUM_THREADS={threads} {PY} kl-reference --model {params.model:q} --dataset {params.dataset:q} "
        "--seqlen {params.seqlen:q} --max-windows {params.max_windows:q} --batch-size {params.batch:q} "
        "--top-k {params.top_k:q} --tail-samples {params.tail:q} --dtype {params.dtype:q} --device {params.device:q} --expect {params.expect:q} "
        "{params.hub} --out {output:q} {params.dmap} --hidden-budget-gb {resources.hidden_budget_gb:q} "
        "--stream-eval-above-gb {resources.stream_eval_above_gb:q} > {log:q} 2>&1"


rule ppl_dense:
    conda:
        "../../envs/coec.yaml"
    input:
        model=W.model_input,
        text=W.dataset_input(W.evaluation["ppl_dataset"]),
        kl_reference=paths.kl_reference_file("{model}"),
    output:
        f"{paths.dense_dir('{model}')}/ppl.json",
    params:
        model=W.model_path,
        dtype=W.model_dtype,
        dmap=W.device_map,
        command="ppl",
        extra="",
        **W.ppl_params(),
        **W.plugin_params("ppl"),
    log:
        paths.log_file("ppl", "{model}", "dense"),
    benchmark:
        paths.benchmark_file("ppl", "{model}", "dense")
    threads: W.threads("ppl")
    resources:
        **W.rule_resources("ppl"),
        **W.stream_resources("ppl"),
    shell:
        "OMP_NUM_THREADS={threads} {PY} {params.command} --model {params.model:q} --dataset {params.dataset:q} --seqlen {params.seqlen:q} "
        "--max-windows {params.max_windows:q} --batch-size {params.batch:q} --dtype {params.dtype:q} "
        "--device {params.device:q} --expect {params.expect:q} {params.hub} --out {output:q} {params.extra} {params.dmap} "
        "--hidden-budget-gb {resources.hidden_budget_gb:q} --stream-eval-above-gb {resources.stream_eval_above_gb:q} "
        "--kl-reference {input.kl_reference:q} > {log:q} 2>&1"


use rule ppl_dense as ppl_cell with:
    input:
        model=W.model_input,
        text=W.dataset_input(W.evaluation["ppl_dataset"]),
        kl_reference=paths.kl_reference_file("{model}"),
        keep=rules.select.output[0],
        comp=W.comp_files,
    output:
        f"{CELL}/ppl.json",
    params:
        extra=W.cell_args,
    log:
        paths.log_file("ppl", CELL_LOG),
    benchmark:
        paths.benchmark_file("ppl", CELL_LOG)


rule zeroshot_dense:
    conda:
        "../../envs/coec.yaml"
    input:
        model=W.model_input,
        data=W.zeroshot_input(),
    output:
        **W.zeroshot_outputs(paths.dense_dir("{model}")),
    params:
        model=W.model_path,
        dtype=W.model_dtype,
        dmap=W.device_map,
        extra="",
        **W.zeroshot_params(),
        **W.plugin_params("zeroshot"),
    log:
        paths.log_file("zeroshot", "{model}", "dense"),
    benchmark:
        paths.benchmark_file("zeroshot", "{model}", "dense")
    threads: W.threads("zeroshot")
    resources:
        **W.rule_resources("zeroshot"),
        **W.stream_resources("zeroshot"),
    shell:
        "OMP_NUM_THREADS={threads} {PY} zeroshot --model {params.model:q} --tasks {params.tasks:q} "
        "{params.data} --limit {params.limit:q} --batch-size {params.batch:q} "
        "--max-length {params.max_length:q} --dtype {params.dtype:q} --device {params.device:q} "
        "--expect {params.expect:q} {params.hub} {params.samples} --out {output[0]:q} {params.extra} {params.dmap} "
        "--hidden-budget-gb {resources.hidden_budget_gb:q} --stream-eval-above-gb {resources.stream_eval_above_gb:q} "
        "> {log:q} 2>&1"


use rule zeroshot_dense as zeroshot_cell with:
    input:
        model=W.model_input,
        data=W.zeroshot_input(),
        keep=rules.select.output[0],
        comp=W.comp_files,
    output:
        **W.zeroshot_outputs(CELL),
    params:
        extra=W.cell_args,
    log:
        paths.log_file("zeroshot", CELL_LOG),
    benchmark:
        paths.benchmark_file("zeroshot", CELL_LOG)
