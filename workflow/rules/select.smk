# Column scores -> keep sets (KV groups and MLP channels per layer).


rule select:
    input:
        model=model_input,
        grams="results/{model}/grams/{calib}",
    output:
        "results/{model}/{calib}/{select}-{ratio}/keep.json",
    params:
        model=lambda wc: model_path(wc.model),
        group_rounding=config.get("group_rounding", "ceil"),
    log:
        "results/logs/select/{model}/{calib}/{select}-{ratio}.log",
    benchmark:
        "results/benchmarks/select/{model}/{calib}/{select}-{ratio}.tsv"
    threads: job_threads("select")
    resources:
        **rule_resources("select"),
    shell:
        "OMP_NUM_THREADS={threads} {PY} select --model {params.model:q} --grams {input.grams} --method {wildcards.select} "
        "--ratio {wildcards.ratio} --group-rounding {params.group_rounding} --out {output} > {log} 2>&1"
