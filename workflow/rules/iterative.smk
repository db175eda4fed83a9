# Iterative multi-domain FLAP (src/coec/iterative/; docs/iterative.md): its wiring is
# coec.iterative.wiring, its paths and specs coec.iterative.targets.
#
#   resources/domains/{domain}/calib.txt                      domain text (code, math, ...)
#   results/{model}/grams/{mix}/                              multi-domain Grams (for select/compensate)
#   results/{model}/{calib}/iterative/{method}/steps/{r1}/{r2}/.../   one cached pruning step each
#   results/{model}/{calib}/iterative/{variant}-{ratio}/      a cell: keep.json, block0-{L-1}.safetensors,
#                                                             iterative.json, ppl.json
#   results/table_iterative.csv (+ .md)
#
# {calib} is a `calibration` entry (one domain: its dataset) or an `iterative.mixes` entry. A step
# folder is named by its chain of cumulative ratios and continues from its parent folder, so chains
# that share a prefix share those steps (with `step: 0.1` the 0.5 cell reuses the three steps of the
# 0.3 cell), and adding a step reruns only what follows it. {method} = {mode}-{structure}.
from coec.iterative import targets as iterative_targets
from coec.iterative.wiring import IterativeWiring

IT = IterativeWiring(W)  # the calibration-size figure's resized calibrations and mixes: in W already
STEP = f"{iterative_targets.steps_dir('{model}', '{calib}', '{method}')}/{{chain}}"
IT_CELL = iterative_targets.cell_dir("{model}", "{calib}", "{variant}", "{ratio}")
IT_LOG = "{model}/{calib}/iterative/{variant}-{ratio}"


rule iterative_domain:
    conda:
        "../../envs/coec.yaml"
    output:
        calib=f"{iterative_targets.domain_dir('{domain}')}/calib.txt",
        manifest=f"{iterative_targets.domain_dir('{domain}')}/manifest.json",
    wildcard_constraints:
        domain=IT.domain_constraint,
    params:
        spec=lambda wc: json.dumps(IT.domains[wc.domain], sort_keys=True),
    log:
        paths.log_file("iterative", "domain", "{domain}"),
    benchmark:
        paths.benchmark_file("iterative", "domain", "{domain}")
    resources:
        **W.rule_resources("prepare"),
    shell:
        "{PY} iterative prepare-domain --spec {params.spec:q} "
        "--out resources/domains/{wildcards.domain:q} > {log:q} 2>&1"


rule iterative_grams:
    conda:
        "../../envs/coec.yaml"
    input:
        model=W.model_input,
        text=IT.text_inputs,
    output:
        directory(paths.grams_dir("{model}", "{calib}")),
    wildcard_constraints:
        calib=IT.mix_constraint,
    params:
        **IT.calib_params(),
        **W.plugin_params("iterative_grams"),
    log:
        paths.log_file("iterative", "grams", "{model}", "{calib}"),
    benchmark:
        paths.benchmark_file("iterative", "grams", "{model}", "{calib}")
    threads: W.threads("calibrate", ("calibrate_threads", "threads"))
    resources:
        **W.rule_resources("calibrate"),
    shell:
        "OMP_NUM_THREADS={threads} {PY} iterative grams "
        "--model {params.model:q} --domains {params.domains:q} --nsamples {params.nsamples:q} "
        "--seqlen {params.seqlen:q} --seed {params.seed:q} --batch-size {params.batch:q} "
        "--dtype {params.dtype:q} --gram-dtype {params.gram_dtype:q} "
        "--variance-mix {params.variance_mix:q} --device {params.device:q} --expect {params.expect:q} {params.hub} "
        "--out {output:q} > {log:q} 2>&1"


ruleorder: iterative_grams > calibrate


rule iterative_step:
    conda:
        "../../envs/coec.yaml"
    input:
        model=W.model_input,
        text=IT.text_inputs,
        parent=IT.parent_files,
    output:
        keep=f"{STEP}/keep.json",
        block=f"{STEP}/bias.safetensors",
        state=f"{STEP}/state.safetensors",
        info=f"{STEP}/iterative.json",
    wildcard_constraints:
        method=IT.METHOD,
        chain=IT.CHAIN,
    params:
        **IT.calib_params(),
        ratio=IT.step_ratio,
        mode=IT.step_mode,
        structure=IT.step_structure,
        group_rounding=W.group_rounding,
        init=IT.init_arg,
        outdir=IT.step_outdir,
        **W.plugin_params("iterative_step"),
    log:
        paths.log_file("iterative", "{model}", "{calib}", "{method}", "steps", "{chain}"),
    benchmark:
        paths.benchmark_file("iterative", "{model}", "{calib}", "{method}", "steps", "{chain}")
    threads: W.threads("calibrate", ("calibrate_threads", "threads"))
    resources:
        **W.rule_resources("calibrate"),
    shell:
        "OMP_NUM_THREADS={threads} {PY} iterative run "
        "--model {params.model:q} --domains {params.domains:q} --nsamples {params.nsamples:q} "
        "--seqlen {params.seqlen:q} --seed {params.seed:q} --batch-size {params.batch:q} "
        "--dtype {params.dtype:q} --gram-dtype {params.gram_dtype:q} "
        "--variance-mix {params.variance_mix:q} --device {params.device:q} --expect {params.expect:q} {params.hub} "
        "--schedule {params.ratio:q} {params.init} "
        "--mode {params.mode:q} --structure {params.structure:q} "
        "--group-rounding {params.group_rounding:q} --block-name bias.safetensors "
        "--out {params.outdir:q} > {log:q} 2>&1"


rule iterative_cell:
    conda:
        "../../envs/coec.yaml"
    input:
        steps=IT.step_infos,
        keep=IT.last_step_keep,
    output:
        keep=f"{IT_CELL}/keep.json",
        info=f"{IT_CELL}/iterative.json",
    wildcard_constraints:
        variant=IT.variant_constraint,
    params:
        variant=IT.variant_json,
    log:
        paths.log_file("iterative", IT_LOG, "cell"),
    benchmark:
        paths.benchmark_file("iterative", IT_LOG, "cell")
    resources:
        **W.rule_resources("report"),
    shell:
        "{PY} iterative collect --steps {input.steps:q} --variant {params.variant:q} "
        "--keep-out {output.keep:q} --info-out {output.info:q} > {log:q} 2>&1"


rule iterative_cell_block:
    conda:
        "../../envs/coec.yaml"
    input:
        IT.last_step_bias,
    output:
        paths.block_file(IT_CELL, "{first}", "{last}"),
    wildcard_constraints:
        variant=IT.variant_constraint,
    log:
        paths.log_file("iterative", IT_LOG, "block{first}-{last}"),
    benchmark:
        paths.benchmark_file("iterative", IT_LOG, "block{first}-{last}")
    resources:
        **W.rule_resources("report"),
    shell:
        "{PY} iterative collect --block {input:q} --first {wildcards.first:q} "
        "--last {wildcards.last:q} --block-out {output:q} > {log:q} 2>&1"


# a cell's perplexity and zero-shot accuracy: the evaluation rules with the iterative cell's
# keep set and block (per-layer widths differ under AL-AM: each layer is pruned to its own)
use rule ppl_cell as iterative_ppl with:
    input:
        model=W.model_input,
        text=W.dataset_input(W.evaluation["ppl_dataset"]),
        kl_reference=paths.kl_reference_file("{model}"),
        keep=rules.iterative_cell.output.keep,
        comp=IT.cell_block,
    output:
        f"{IT_CELL}/ppl.json",
    wildcard_constraints:
        variant=IT.variant_constraint,
    log:
        paths.log_file("ppl", IT_LOG),
    benchmark:
        paths.benchmark_file("ppl", IT_LOG)


use rule zeroshot_cell as iterative_zeroshot with:
    input:
        model=W.model_input,
        data=W.zeroshot_input(),
        keep=rules.iterative_cell.output.keep,
        comp=IT.cell_block,
    output:
        **W.zeroshot_outputs(IT_CELL),
    wildcard_constraints:
        variant=IT.variant_constraint,
    log:
        paths.log_file("zeroshot", IT_LOG),
    benchmark:
        paths.benchmark_file("zeroshot", IT_LOG)


# ----------------------------------------------------------------------------- table and figure
use rule table as table_iterative with:
    input:
        lambda wc: targets.spec_inputs(iterative_targets.table_spec(W.config)),
    output:
        main=report_output(paths.table_file("table_iterative"), "table.rst", "Iterative"),
        md=paths.table_file("table_iterative", "md"),
    params:
        kind="table",
        spec=lambda wc: json.dumps(iterative_targets.table_spec(W.config)),
    log:
        paths.log_file("report", "table_iterative"),
    benchmark:
        paths.benchmark_file("report", "table_iterative")


use rule table as table_iterative_zeroshot with:
    input:
        lambda wc: targets.spec_inputs(iterative_targets.zeroshot_table_spec(W.config)),
    output:
        main=report_output(paths.table_file("table_iterative_zeroshot"), "table.rst", "Iterative"),
        md=paths.table_file("table_iterative_zeroshot", "md"),
    params:
        kind="table",
        spec=lambda wc: json.dumps(iterative_targets.zeroshot_table_spec(W.config)),
    log:
        paths.log_file("report", "table_iterative_zeroshot"),
    benchmark:
        paths.benchmark_file("report", "table_iterative_zeroshot")


use rule table as iterative_calibration_size with:
    input:
        lambda wc: targets.figure_inputs(iterative_targets.size_spec(W.config)),
    output:
        main=report_output(paths.figure_file("iterative_calibration_size"), "iterative_size.rst", "Iterative"),
    params:
        kind="lines-figure",
        spec=lambda wc: json.dumps(iterative_targets.size_spec(W.config)),
    log:
        paths.log_file("report", "iterative_calibration_size"),
    benchmark:
        paths.benchmark_file("report", "iterative_calibration_size")
