# Iterative multi-domain FLAP (src/coec/iterative/, its stages in src/coec/stages_iterative.py; docs/iterative.md).
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

# Path helpers: it_* in common.smk; specs and config checks: coec.targets.iterative_*.

# calibration-size figure: its resized calibrations and mixes exist before the rules are defined
targets.add_iterative_size_calibrations(config)
targets.check_iterative_config(config)


# ----------------------------------------------------------------------------- rules
rule iterative_domain:
    conda:
        "../../envs/coec.yaml"
    output:
        calib="resources/domains/{domain}/calib.txt",
        manifest="resources/domains/{domain}/manifest.json",
    wildcard_constraints:
        domain=it_alternatives([d for d, s in IT_DOMAINS.items() if s["source"] != "dataset"]),
    params:
        spec=lambda wc: json.dumps(IT_DOMAINS[wc.domain], sort_keys=True),
    log:
        "results/logs/iterative/domain/{domain}.log",
    benchmark:
        "results/benchmarks/iterative/domain/{domain}.tsv"
    resources:
        **rule_resources("prepare"),
    shell:
        "{PY} iterative prepare-domain --spec {params.spec:q} "
        "--out resources/domains/{wildcards.domain:q} > {log:q} 2>&1"


rule iterative_grams:
    conda:
        "../../envs/coec.yaml"
    input:
        model=model_input,
        text=it_text_inputs,
    output:
        directory("results/{model}/grams/{calib}"),
    wildcard_constraints:
        calib=it_alternatives(IT_MIXES),
    params:
        **it_calib_params(),
    log:
        "results/logs/iterative/grams/{model}/{calib}.log",
    benchmark:
        "results/benchmarks/iterative/grams/{model}/{calib}.tsv"
    threads: job_threads("calibrate", ("calibrate_threads", "threads"))
    resources:
        **rule_resources("calibrate"),
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
        model=model_input,
        text=it_text_inputs,
        parent=it_parent_files,
    output:
        keep="results/{model}/{calib}/iterative/{method}/steps/{chain}/keep.json",
        block="results/{model}/{calib}/iterative/{method}/steps/{chain}/bias.safetensors",
        state="results/{model}/{calib}/iterative/{method}/steps/{chain}/state.safetensors",
        info="results/{model}/{calib}/iterative/{method}/steps/{chain}/iterative.json",
    wildcard_constraints:
        method=r"(global|sequential)-(uniform|al-am)",
        chain=r"0\.[0-9]+(/0\.[0-9]+)*",
    params:
        **it_calib_params(),
        ratio=lambda wc: wc.chain.rsplit("/", 1)[-1],
        mode=lambda wc: wc.method.split("-", 1)[0],
        structure=lambda wc: wc.method.split("-", 1)[1],
        group_rounding=config["group_rounding"],
        init=lambda wc: "" if it_parent(wc) is None else f"--init {shlex_quote(it_parent(wc))}",
        outdir=lambda wc, output: os.path.dirname(output.keep),
    log:
        "results/logs/iterative/{model}/{calib}/{method}/steps/{chain}.log",
    benchmark:
        "results/benchmarks/iterative/{model}/{calib}/{method}/steps/{chain}.tsv"
    threads: job_threads("calibrate", ("calibrate_threads", "threads"))
    resources:
        **rule_resources("calibrate"),
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
        steps=lambda wc: [f"{d}/iterative.json" for d in it_cell_steps(wc)],
        keep=lambda wc: f"{it_cell_steps(wc)[-1]}/keep.json",
    output:
        keep="results/{model}/{calib}/iterative/{variant}-{ratio}/keep.json",
        info="results/{model}/{calib}/iterative/{variant}-{ratio}/iterative.json",
    wildcard_constraints:
        variant=it_alternatives(IT_VARIANTS),
    params:
        variant=lambda wc: json.dumps(targets.iterative_variant(config, wc.variant), sort_keys=True),
    log:
        "results/logs/iterative/{model}/{calib}/{variant}-{ratio}/cell.log",
    benchmark:
        "results/benchmarks/iterative/{model}/{calib}/{variant}-{ratio}/cell.tsv"
    resources:
        **rule_resources("report"),
    shell:
        "{PY} iterative collect --steps {input.steps:q} --variant {params.variant:q} "
        "--keep-out {output.keep:q} --info-out {output.info:q} > {log:q} 2>&1"


rule iterative_cell_block:
    conda:
        "../../envs/coec.yaml"
    input:
        lambda wc: f"{it_cell_steps(wc)[-1]}/bias.safetensors",
    output:
        "results/{model}/{calib}/iterative/{variant}-{ratio}/block{first}-{last}.safetensors",
    wildcard_constraints:
        variant=it_alternatives(IT_VARIANTS),
    log:
        "results/logs/iterative/{model}/{calib}/{variant}-{ratio}/block{first}-{last}.log",
    benchmark:
        "results/benchmarks/iterative/{model}/{calib}/{variant}-{ratio}/block{first}-{last}.tsv"
    resources:
        **rule_resources("report"),
    shell:
        "{PY} iterative collect --block {input:q} --first {wildcards.first:q} "
        "--last {wildcards.last:q} --block-out {output:q} > {log:q} 2>&1"


rule iterative_ppl:
    conda:
        "../../envs/coec.yaml"
    input:
        model=model_input,
        text=dataset_input(EV["ppl_dataset"]),
        keep="results/{model}/{calib}/iterative/{variant}-{ratio}/keep.json",
        comp=it_cell_block,
    output:
        "results/{model}/{calib}/iterative/{variant}-{ratio}/ppl.json",
    wildcard_constraints:
        variant=it_alternatives(IT_VARIANTS),
    params:
        model=lambda wc: model_path(wc.model),
        dtype=lambda wc: model_cfg(wc.model)["dtype"],
        # per-layer widths differ under AL-AM: evaluated in memory by `iterative ppl`
        cmd=lambda wc: "ppl" if targets.iterative_variant(config, wc.variant)["structure"] == "uniform"
        else "iterative ppl",
        extra=lambda wc, input: cell_args(wc, input),
        **ppl_params(),
    log:
        "results/logs/ppl/{model}/{calib}/iterative/{variant}-{ratio}.log",
    benchmark:
        "results/benchmarks/ppl/{model}/{calib}/iterative/{variant}-{ratio}.tsv"
    threads: job_threads("ppl")
    resources:
        **rule_resources("ppl"),
    shell:
        "OMP_NUM_THREADS={threads} {PY} {params.cmd} --model {params.model:q} --dataset {params.dataset:q} "
        "--seqlen {params.seqlen:q} --max-windows {params.max_windows:q} --batch-size {params.batch:q} "
        "--dtype {params.dtype:q} --device {params.device:q} --expect {params.expect:q} {params.hub} --out {output:q} "
        "{params.extra} > {log:q} 2>&1"


# ----------------------------------------------------------------------------- table
rule table_iterative:
    conda:
        "../../envs/coec.yaml"
    input:
        lambda wc: targets.spec_inputs(targets.iterative_table_spec(config)),
    output:
        csv=report("results/table_iterative.csv", caption="../report/table.rst", category="Iterative",
                   labels=lambda wc: targets.report_label(config, "results/table_iterative.csv")),
        md="results/table_iterative.md",
    params:
        spec=lambda wc: json.dumps(targets.iterative_table_spec(config)),
    log:
        "results/logs/report/table_iterative.log",
    benchmark:
        "results/benchmarks/report/table_iterative.tsv"
    resources:
        **rule_resources("report"),
    shell:
        "{PY} report --kind table --spec {params.spec:q} --out {output.csv:q} > {log:q} 2>&1"


rule iterative_zeroshot:
    conda:
        "../../envs/coec.yaml"
    input:
        model=model_input,
        data=ZS_INPUT,
        keep="results/{model}/{calib}/iterative/{variant}-{ratio}/keep.json",
        comp=it_cell_block,
    output:
        **zs_outputs("results/{model}/{calib}/iterative/{variant}-{ratio}"),
    wildcard_constraints:
        variant=it_alternatives(IT_VARIANTS),
    params:
        model=lambda wc: model_path(wc.model),
        dtype=lambda wc: model_cfg(wc.model)["dtype"],
        dmap=device_map_arg,
        extra=lambda wc, input: cell_args(wc, input),
        **zeroshot_params(),
    log:
        "results/logs/zeroshot/{model}/{calib}/iterative/{variant}-{ratio}.log",
    benchmark:
        "results/benchmarks/zeroshot/{model}/{calib}/iterative/{variant}-{ratio}.tsv"
    threads: job_threads("zeroshot")
    resources:
        **rule_resources("zeroshot"),
    shell:
        ZS_SHELL


rule table_iterative_zeroshot:
    conda:
        "../../envs/coec.yaml"
    input:
        lambda wc: targets.spec_inputs(targets.iterative_zeroshot_table_spec(config)),
    output:
        csv=report("results/table_iterative_zeroshot.csv", caption="../report/table.rst",
                   category="Iterative",
                   labels=lambda wc: targets.report_label(config, "results/table_iterative_zeroshot.csv")),
        md="results/table_iterative_zeroshot.md",
    params:
        spec=lambda wc: json.dumps(targets.iterative_zeroshot_table_spec(config)),
    log:
        "results/logs/report/table_iterative_zeroshot.log",
    benchmark:
        "results/benchmarks/report/table_iterative_zeroshot.tsv"
    resources:
        **rule_resources("report"),
    shell:
        "{PY} report --kind table --spec {params.spec:q} --out {output.csv:q} > {log:q} 2>&1"


# ----------------------------------------------------------------------------- figure
rule iterative_calibration_size:
    conda:
        "../../envs/coec.yaml"
    input:
        lambda wc: targets.figure_inputs(targets.iterative_size_spec(config)),
    output:
        report("results/figures/iterative_calibration_size.png",
               caption="../report/iterative_size.rst", category="Iterative",
               labels=lambda wc: targets.report_label(config, "results/figures/iterative_calibration_size.png")),
    params:
        spec=lambda wc: json.dumps(targets.iterative_size_spec(config)),
    log:
        "results/logs/report/iterative_calibration_size.log",
    benchmark:
        "results/benchmarks/report/iterative_calibration_size.tsv"
    resources:
        **rule_resources("report"),
    shell:
        "{PY} report --kind lines-figure --spec {params.spec:q} --out {output:q} > {log:q} 2>&1"
