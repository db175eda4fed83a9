# One layer-by-layer pass per (model, calibration set): Grams, channel sums, token counts of
# every layer's o_proj and down_proj inputs. Shared by every selection and compensation. Each layer is
# read from the checkpoint when the pass reaches it; a killed job resumes (docs/streaming.md).


rule calibrate:
    conda:
        "../../envs/coec.yaml"
    input:
        model=model_input,
        text=lambda wc: dataset_input(calib_cfg(wc.calib)["dataset"]),
    output:
        directory("results/{model}/grams/{calib}"),
    params:
        model=lambda wc: model_path(wc.model),
        dataset=lambda wc: json.dumps(calib_dataset_spec(wc.calib)),
        nsamples=lambda wc: calib_cfg(wc.calib)["nsamples"],
        seqlen=lambda wc: calib_cfg(wc.calib)["seqlen"],
        seed=lambda wc: calib_cfg(wc.calib)["seed"],
        batch=lambda wc: calib_cfg(wc.calib)["batch_size"],
        gram_dtype=lambda wc: calib_cfg(wc.calib)["gram_dtype"],
        dtype=lambda wc: model_cfg(wc.model)["dtype"],
        device=config["compute"]["device"],
        expect=lambda wc: model_expect(wc.model, f"calibration.{wc.calib}.seqlen"),
        hub=lambda wc: hub_args(wc.model),
        stream=stream_args("calibrate"),
    log:
        "results/logs/calibrate/{model}/{calib}.log",
    benchmark:
        "results/benchmarks/calibrate/{model}/{calib}.tsv"
    threads: job_threads("calibrate", ("calibrate_threads", "threads"))
    resources:
        **rule_resources("calibrate"),
    shell:
        "OMP_NUM_THREADS={threads} {PY} calibrate --model {params.model:q} --dataset {params.dataset:q} "
        "--nsamples {params.nsamples:q} --seqlen {params.seqlen:q} --seed {params.seed:q} "
        "--batch-size {params.batch:q} --dtype {params.dtype:q} --gram-dtype {params.gram_dtype:q} "
        "--device {params.device:q} --expect {params.expect:q} {params.hub} {params.stream} --out {output:q} > {log:q} 2>&1"
