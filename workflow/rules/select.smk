# Column scores -> keep sets (KV groups and MLP channels per layer).


rule select:
    conda:
        "../../envs/coec.yaml"
    wildcard_constraints:
        select=W.select_constraint(search=False),  # a width search's keep.json: rule search (search.smk)
    input:
        model=W.model_input,
        grams=rules.calibrate.output[0],
    output:
        paths.keep_file("{model}", "{calib}", "{select}", "{ratio}"),
    params:
        model=W.model_path,
        group_rounding=W.group_rounding,
        method=W.selection_args,
        expect=W.expect,
        hub=W.hub,
        **W.plugin_params("select"),
    log:
        paths.log_file("select", "{model}", "{calib}", "{select}-{ratio}"),
    benchmark:
        paths.benchmark_file("select", "{model}", "{calib}", "{select}-{ratio}")
    threads: W.threads("select")
    resources:
        **W.rule_resources("select"),
    shell:
        "OMP_NUM_THREADS={threads} {PY} select --model {params.model:q} --grams {input.grams:q} "
        "{params.method} --ratio {wildcards.ratio:q} --group-rounding {params.group_rounding:q} "
        "--expect {params.expect:q} {params.hub} --out {output:q} > {log:q} 2>&1"
