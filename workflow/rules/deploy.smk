# The pruned model as a product (docs/deploy.md, docs/export.md "GGUF"): a GGUF file for llama.cpp
# next to each cell's HF export, for the dense model and for iterative cells too, and the measured
# deployment cost beside Table 4. Included after iterative.smk (its cells are exported too).
#
#   results/{model}/{calib}/{select}-{ratio}/{comp}/export-{gguf_type}.gguf (+ .gguf.json)
#   results/{model}/{calib}/iterative/{variant}-{ratio}/export-{gguf_type}.gguf (+ .gguf.json)
#   results/{model}/dense/export-{gguf_type}.gguf (+ .gguf.json)   (the unpruned model, same writer)
#   .../ppl-gguf-{gguf_type}.json beside each export (its perplexity in llama.cpp, below)
#   results/table4_measured.csv (+ .md, .runs.json), results/figures/table4_measured.png
#
# {gguf_type}: f32 | f16 | q8_0 | q6_k | q5_k_m | q5_1 | q5_0 | q4_k_m | q4_1 | q4_0 | iq4_xs |
# q3_k_m | q3_k_s | q2_k (coec.export.formats.GGUF_TYPES). gguf-py writes f32, f16 and the block
# types, which fall back to f16 per tensor where a row width is not a multiple of 32; llama.cpp's
# quantizer makes the mixes q6_k, q5_k_m, q4_k_m, iq4_xs, q3_k_m, q3_k_s, q2_k from an f32 file (it
# needs llama-cpp-python) and falls back where a row width is not a multiple of 256. The sidecar
# export-{gguf_type}.gguf.json lists every tensor that did not get the requested type, why, and who
# chose (docs/export.md "GGUF").
# A mix's name with -imatrix (q4_k_m-imatrix, q2_k-imatrix, ...: GGUF_VARIANTS) is quantized with
# the importance matrix below: the cell's own, or the dense model's on `imatrix_calibration` (the
# first calibration set unless given). Iterative cells take the types only.
from coec.export.formats import GGUF_TYPES, GGUF_VARIANTS
from coec.workflow.targets import measured as deploy_spec


wildcard_constraints:
    gguf_type="|".join(GGUF_VARIANTS),


rule export_gguf:
    conda:
        "../../envs/coec.yaml"
    input:
        model=W.model_input,
        keep=rules.select.output[0],
        comp=W.comp_files,
        imatrix=W.gguf_imatrix,
    output:
        gguf=paths.gguf_file(CELL, "{gguf_type}"),
        report=paths.gguf_report_file(CELL, "{gguf_type}"),
    params:
        model=W.model_path,
        hub=W.hub,
        dtype=W.model_dtype,
        expect=W.expect,
        cell=W.cell_args,
        gguf=W.gguf_args,
        **W.plugin_params("export_gguf"),
    log:
        paths.log_file("export", f"{CELL_LOG}-{{gguf_type}}"),
    benchmark:
        paths.benchmark_file("export", f"{CELL_LOG}-{{gguf_type}}")
    threads: W.threads("export")
    resources:
        **W.export_resources(),
    shell:
        "OMP_NUM_THREADS={threads} {PY} export --format gguf {params.gguf} "
        "--model {params.model:q} {params.hub} --dtype {params.dtype:q} --expect {params.expect:q} "
        "{params.cell} --out {output.gguf:q} > {log:q} 2>&1"


use rule export_gguf as export_gguf_iterative with:
    input:
        model=W.model_input,
        keep=rules.iterative_cell.output.keep,
        comp=IT.cell_block,
    output:
        gguf=paths.gguf_file(IT_CELL, "{gguf_type}"),
        report=paths.gguf_report_file(IT_CELL, "{gguf_type}"),
    wildcard_constraints:
        variant=IT.variant_constraint,
        gguf_type="|".join(GGUF_TYPES),
    log:
        paths.log_file("export", f"{IT_LOG}-{{gguf_type}}"),
    benchmark:
        paths.benchmark_file("export", f"{IT_LOG}-{{gguf_type}}")


use rule export_gguf as export_gguf_dense with:
    input:
        model=W.model_input,
        imatrix=W.gguf_imatrix,
    output:
        gguf=paths.gguf_file(paths.dense_dir("{model}"), "{gguf_type}"),
        report=paths.gguf_report_file(paths.dense_dir("{model}"), "{gguf_type}"),
    params:
        model=W.model_path,
        hub=W.hub,
        dtype=W.model_dtype,
        expect=W.expect,
        cell=W.cell_label_args,
        gguf=W.gguf_args,
    log:
        paths.log_file("export", "{model}", "dense-{gguf_type}"),
    benchmark:
        paths.benchmark_file("export", "{model}", "dense-{gguf_type}")


# Every configuration is measured in processes of its own, interleaved; the job takes every core
# Snakemake gives it (--cores caps it), so nothing else runs beside the measurement.
rule table4_measured:
    conda:
        "../../envs/coec.yaml"
    input:
        lambda wc: deploy_spec.measured_inputs(W.config),
    output:
        csv=paths.table_file(deploy_spec.KEY),
        md=paths.table_file(deploy_spec.KEY, "md"),
        runs=paths.table_file(deploy_spec.KEY, "runs.json"),
        png=paths.figure_file(deploy_spec.KEY),
    params:
        spec=lambda wc: json.dumps(deploy_spec.measured_spec(W.config)),
    log:
        paths.log_file("report", deploy_spec.KEY),
    benchmark:
        paths.benchmark_file("report", deploy_spec.KEY)
    threads: os.cpu_count() or 1
    resources:
        **W.rule_resources("report"),
    shell:
        "{PY} report --kind table4-measured --spec {params.spec:q} --out {output.csv:q} > {log:q} 2>&1"


# The importance matrix for llama.cpp's quantizer (docs/export.md "Importance matrix from the
# calibration"): the mean x^2 of each quantized weight's input columns, on the exported model (the
# cell as built, or the dense model) over a calibration set's windows; `export --imatrix` reads it.
#
#   results/{model}/{calib}/{select}-{ratio}/{comp}/imatrix.safetensors   (the cell's own calibration)
#   results/{model}/dense/imatrix-{calib}.safetensors
rule imatrix_dense:
    conda:
        "../../envs/coec.yaml"
    input:
        model=W.model_input,
        text=W.calibration_text,
    output:
        paths.imatrix_file(paths.dense_dir("{model}"), "{calib}"),
    params:
        model=W.model_path,
        dataset=lambda wc: json.dumps(W.calibration_dataset(wc.calib)),
        nsamples=W.calibration_param("nsamples"),
        seqlen=W.calibration_param("seqlen"),
        seed=W.calibration_param("seed"),
        batch=W.calibration_param("batch_size"),
        dtype=W.model_dtype,
        device=W.device,
        expect=lambda wc: W.expect_json(wc.model, f"calibration.{wc.calib}.seqlen"),
        hub=W.hub,
        extra="",
        **W.plugin_params("imatrix"),
    log:
        paths.log_file("imatrix", "{model}", "dense-{calib}"),
    benchmark:
        paths.benchmark_file("imatrix", "{model}", "dense-{calib}")
    threads: W.threads("calibrate", ("calibrate_threads", "threads"))
    resources:
        **W.rule_resources("calibrate"),
    shell:
        "OMP_NUM_THREADS={threads} {PY} imatrix --model {params.model:q} --dataset {params.dataset:q} "
        "--nsamples {params.nsamples:q} --seqlen {params.seqlen:q} --seed {params.seed:q} "
        "--batch-size {params.batch:q} --dtype {params.dtype:q} --device {params.device:q} "
        "--expect {params.expect:q} {params.hub} {params.extra} --out {output:q} > {log:q} 2>&1"


use rule imatrix_dense as imatrix_cell with:
    input:
        model=W.model_input,
        text=W.calibration_text,
        keep=rules.select.output[0],
        comp=W.comp_files,
    output:
        paths.imatrix_file(CELL),
    params:
        extra=W.cell_args,
    log:
        paths.log_file("imatrix", CELL_LOG),
    benchmark:
        paths.benchmark_file("imatrix", CELL_LOG)


# Perplexity of a GGUF export measured in llama.cpp (coec ppl --gguf; docs/deploy.md "Perplexity
# in llama.cpp"): the windows of ppl.json, cut by the model's own tokenizer, and the mean token KL
# to the transformers dense model (the model's kl-reference.safetensors, docs/kl.md).
#
#   results/{model}/{calib}/{select}-{ratio}/{comp}/ppl-gguf-{gguf_type}.json
#   results/{model}/{calib}/iterative/{variant}-{ratio}/ppl-gguf-{gguf_type}.json
#   results/{model}/dense/ppl-gguf-{gguf_type}.json
rule ppl_gguf_cell:
    conda:
        "../../envs/coec.yaml"
    input:
        gguf=paths.gguf_file(CELL, "{gguf_type}"),
        model=W.model_input,
        text=W.dataset_input(W.evaluation["ppl_dataset"]),
        kl_reference=paths.kl_reference_file("{model}"),
    output:
        paths.gguf_ppl_file(CELL, "{gguf_type}"),
    params:
        model=W.model_path,
        cell=W.cell_label_args,
        **W.ppl_params(),
    log:
        paths.log_file("ppl", f"{CELL_LOG}-gguf-{{gguf_type}}"),
    benchmark:
        paths.benchmark_file("ppl", f"{CELL_LOG}-gguf-{{gguf_type}}")
    threads: W.threads("ppl")
    resources:
        **W.rule_resources("ppl"),
    shell:
        "OMP_NUM_THREADS={threads} {PY} ppl --gguf {input.gguf:q} --threads {threads} --model {params.model:q} "
        "--dataset {params.dataset:q} --seqlen {params.seqlen:q} --max-windows {params.max_windows:q} "
        "--expect {params.expect:q} {params.hub} {params.cell} --kl-reference {input.kl_reference:q} --out {output:q} "
        "> {log:q} 2>&1"


use rule ppl_gguf_cell as ppl_gguf_iterative with:
    input:
        gguf=paths.gguf_file(IT_CELL, "{gguf_type}"),
        model=W.model_input,
        text=W.dataset_input(W.evaluation["ppl_dataset"]),
        kl_reference=paths.kl_reference_file("{model}"),
    output:
        paths.gguf_ppl_file(IT_CELL, "{gguf_type}"),
    wildcard_constraints:
        variant=IT.variant_constraint,
        gguf_type="|".join(GGUF_TYPES),
    log:
        paths.log_file("ppl", f"{IT_LOG}-gguf-{{gguf_type}}"),
    benchmark:
        paths.benchmark_file("ppl", f"{IT_LOG}-gguf-{{gguf_type}}")


use rule ppl_gguf_cell as ppl_gguf_dense with:
    input:
        gguf=paths.gguf_file(paths.dense_dir("{model}"), "{gguf_type}"),
        model=W.model_input,
        text=W.dataset_input(W.evaluation["ppl_dataset"]),
        kl_reference=paths.kl_reference_file("{model}"),
    output:
        paths.gguf_ppl_file(paths.dense_dir("{model}"), "{gguf_type}"),
    log:
        paths.log_file("ppl", "{model}", "dense-gguf-{gguf_type}"),
    benchmark:
        paths.benchmark_file("ppl", "{model}", "dense-gguf-{gguf_type}")
