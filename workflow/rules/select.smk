# Column scores -> keep sets (KV groups and MLP channels per layer).


rule select:
    conda:
        "../../envs/coec.yaml"
    input:
        model=model_input,
        grams="results/{model}/grams/{calib}",
    output:
        "results/{model}/{calib}/{select}-{ratio}/keep.json",
    params:
        model=lambda wc: model_path(wc.model),
        group_rounding=config["group_rounding"],
        method=lambda wc: selection_args(wc.select),
        expect=lambda wc: model_expect(wc.model),
        hub=lambda wc: hub_args(wc.model),
    log:
        "results/logs/select/{model}/{calib}/{select}-{ratio}.log",
    benchmark:
        "results/benchmarks/select/{model}/{calib}/{select}-{ratio}.tsv"
    threads: job_threads("select")
    resources:
        **rule_resources("select"),
    shell:
        "OMP_NUM_THREADS={threads} {PY} select --model {params.model:q} --grams {input.grams:q} "
        "{params.method} --ratio {wildcards.ratio:q} --group-rounding {params.group_rounding:q} "
        "--expect {params.expect:q} {params.hub} --out {output:q} > {log:q} 2>&1"
