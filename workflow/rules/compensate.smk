# Compensation of o_proj and down_proj, one job per block of layers (compute.compensate_block;
# 1 on a cluster = one GPU job per layer). Options come from config.compensations.<comp>, so
# changing one method's options reruns only that method's cells; a method's extra inputs (another
# cell's weights, held-out Grams) come from its registered declaration (coec.compensate.inputs).
# A method without errors of its own reads the calibration's Gram check (rule gram_check).


rule compensate:
    conda:
        "../../envs/coec.yaml"
    wildcard_constraints:
        comp=W.comp_constraint(base=False),
    input:
        unpack(W.method_inputs),
        model=W.model_input,
        grams=rules.calibrate.output[0],
        keep=rules.select.output[0],
        gram_check=W.gram_check_input,
    output:
        weights=paths.block_file(CELL, "{first}", "{last}"),
        info=paths.block_info_file(CELL, "{first}", "{last}"),
    params:
        model=W.model_path,
        spec=W.compensate_spec,
        device=W.device,
        expect=W.expect,
        hub=W.hub,
        gram_check=W.gram_check_arg,
        **W.plugin_params("compensate"),
    log:
        paths.log_file("compensate", CELL_LOG, "block{first}-{last}"),
    benchmark:
        paths.benchmark_file("compensate", CELL_LOG, "block{first}-{last}")
    threads: W.threads("compensate")
    resources:
        **W.rule_resources("compensate"),
    shell:
        "OMP_NUM_THREADS={threads} {PY} compensate --model {params.model:q} --grams {input.grams:q} "
        "--keep {input.keep:q} --spec {params.spec:q} --first {wildcards.first:q} --last {wildcards.last:q} "
        "--device {params.device:q} --expect {params.expect:q} {params.hub} {params.gram_check} --out {output.weights:q} "
        "> {log:q} 2>&1"


# The compensations another method reads the blocks of (blend's base) run as rule
# compensate_base, the same job under another name: `snakemake --until compensate` releases no
# job after a job of the rule it names, so blend's jobs could never start after their base's.
use rule compensate as compensate_base with:
    wildcard_constraints:
        comp=W.comp_constraint(base=True),
