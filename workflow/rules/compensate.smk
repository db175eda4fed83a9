# Compensation of o_proj and down_proj, one job per block of layers (compute.compensate_block;
# 1 on a cluster = one GPU job per layer). Options come from config.compensations.<comp>, so
# changing one method's options reruns only that method's cells.


rule compensate:
    conda:
        "../../envs/coec.yaml"
    input:
        unpack(method_inputs),
        model=model_input,
        grams="results/{model}/grams/{calib}",
        keep="results/{model}/{calib}/{select}-{ratio}/keep.json",
    output:
        weights="results/{model}/{calib}/{select}-{ratio}/{comp}/block{first}-{last}.safetensors",
        info="results/{model}/{calib}/{select}-{ratio}/{comp}/block{first}-{last}.json",
    params:
        model=lambda wc: model_path(wc.model),
        spec=compensate_spec,
        device=config["compute"]["device"],
        expect=lambda wc: model_expect(wc.model),
        hub=lambda wc: hub_args(wc.model),
    log:
        "results/logs/compensate/{model}/{calib}/{select}-{ratio}/{comp}/block{first}-{last}.log",
    benchmark:
        "results/benchmarks/compensate/{model}/{calib}/{select}-{ratio}/{comp}/block{first}-{last}.tsv"
    threads: job_threads("compensate")
    resources:
        **rule_resources("compensate"),
    shell:
        "OMP_NUM_THREADS={threads} {PY} compensate --model {params.model:q} --grams {input.grams:q} "
        "--keep {input.keep:q} --spec {params.spec:q} --first {wildcards.first:q} --last {wildcards.last:q} "
        "--device {params.device:q} --expect {params.expect:q} {params.hub} --out {output.weights:q} > {log:q} 2>&1"
