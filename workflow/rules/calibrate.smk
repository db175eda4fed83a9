# One layer-by-layer pass per (model, calibration set): Grams, channel sums, token counts of
# every layer's o_proj and down_proj inputs. Shared by every selection and compensation. Each layer is
# read from the checkpoint when the pass reaches it; a killed job resumes (docs/streaming.md).


rule calibrate:
    conda:
        "../../envs/coec.yaml"
    input:
        model=W.model_input,
        text=W.calibration_text,
    output:
        directory(paths.grams_dir("{model}", "{calib}")),
    params:
        model=W.model_path,
        dataset=lambda wc: json.dumps(W.calibration_dataset(wc.calib)),
        nsamples=W.calibration_param("nsamples"),
        seqlen=W.calibration_param("seqlen"),
        seed=W.calibration_param("seed"),
        batch=W.calibration_param("batch_size"),
        gram_dtype=W.calibration_param("gram_dtype"),
        dtype=W.model_dtype,
        device=W.device,
        expect=lambda wc: W.expect_json(wc.model, f"calibration.{wc.calib}.seqlen"),
        hub=W.hub,
        **W.plugin_params("calibrate"),
    log:
        paths.log_file("calibrate", "{model}", "{calib}"),
    benchmark:
        paths.benchmark_file("calibrate", "{model}", "{calib}")
    threads: W.threads("calibrate", ("calibrate_threads", "threads"))
    resources:
        **W.rule_resources("calibrate"),
        **W.stream_resources("calibrate"),
    shell:
        "OMP_NUM_THREADS={threads} {PY} calibrate --model {params.model:q} --dataset {params.dataset:q} "
        "--nsamples {params.nsamples:q} --seqlen {params.seqlen:q} --seed {params.seed:q} "
        "--batch-size {params.batch:q} --dtype {params.dtype:q} --gram-dtype {params.gram_dtype:q} "
        "--device {params.device:q} --expect {params.expect:q} {params.hub} "
        "--hidden-budget-gb {resources.hidden_budget_gb:q} --checkpoint-minutes {resources.checkpoint_minutes:q} "
        "--out {output:q} > {log:q} 2>&1"


# App. B's verdict on every Gram of a calibration and each compensated module's output energy on
# it, formed once and read by every compensation job whose method reports no errors of its own
# (coec.compensate.gram_check); the compensation job's resources.


rule gram_check:
    conda:
        "../../envs/coec.yaml"
    input:
        model=W.model_input,
        grams=rules.calibrate.output[0],
    output:
        paths.gram_check_file("{model}", "{calib}"),
    params:
        model=W.model_path,
        device=W.device,
        expect=W.expect,
        hub=W.hub,
        **W.plugin_params("gram_check"),
    log:
        paths.log_file("gram_check", "{model}", "{calib}"),
    benchmark:
        paths.benchmark_file("gram_check", "{model}", "{calib}")
    threads: W.threads("compensate")
    resources:
        **W.rule_resources("compensate"),
    shell:
        "OMP_NUM_THREADS={threads} {PY} gram-check --model {params.model:q} --grams {input.grams:q} "
        "--device {params.device:q} --expect {params.expect:q} {params.hub} --out {output:q} > {log:q} 2>&1"
