# Per-layer widths searched under one budget (docs/search.md; coec.select.search.stage): its
# wiring is coec.workflow.search_wiring. A `selections` entry with `score: search` is a selection
# whose keep.json this rule writes; its cells then run compensate, ppl, zeroshot, export and the
# tables like any selection's.
#
#   results/{model}/{calib}/search/{select}/{comp}/layer{i}.safetensors (+ .json)   candidates of
#       one layer: selection {select}'s keep set at every level, refit by compensation {comp}
#   results/{model}/{calib}/{select}-{ratio}/keep.json, search.json                 a search's
#       allocation (per-layer widths) and its record (budget, realised cost, fitness curve)
#
# Candidates are cached per layer with all its levels: a new budget, ratio, allocation or search
# option reruns only the search job; a new compensation only its own candidates. A compensation
# method's extra inputs come as a compensate job's (SW.candidate_inputs): blend's held-out Grams,
# and its base's candidates of the same layer in place of the base cell's block.
from coec.workflow.search_wiring import SearchWiring

SW = SearchWiring(W)


rule search_candidates:
    conda:
        "../../envs/coec.yaml"
    input:
        unpack(SW.candidate_inputs),
        model=W.model_input,
        grams=rules.calibrate.output[0],
    output:
        weights=paths.search_candidates_file("{model}", "{calib}", "{select}", "{comp}", "{layer}"),
        info=paths.search_candidates_file("{model}", "{calib}", "{select}", "{comp}", "{layer}", "json"),
    wildcard_constraints:
        select=W.select_constraint(search=False),
        layer=r"[0-9]+",
    params:
        model=W.model_path,
        selection=SW.candidate_args,
        spec=SW.compensation_spec,
        cell=lambda wc: json.dumps(dict(wc.items()), sort_keys=True),
        device=W.device,
        expect=W.expect,
        hub=W.hub,
        **SW.plugin_params("search_candidates"),
    log:
        paths.log_file("search", "{model}", "{calib}", "candidates", "{select}", "{comp}", "layer{layer}"),
    benchmark:
        paths.benchmark_file("search", "{model}", "{calib}", "candidates", "{select}", "{comp}", "layer{layer}")
    threads: W.threads("compensate")
    resources:
        **W.rule_resources("compensate"),
    shell:
        "OMP_NUM_THREADS={threads} {PY} search candidates --model {params.model:q} --grams {input.grams:q} "
        "{params.selection} --spec {params.spec:q} --layer {wildcards.layer:q} --cell {params.cell:q} "
        "--device {params.device:q} --expect {params.expect:q} {params.hub} --out {output.weights:q} > {log:q} 2>&1"


rule search:
    conda:
        "../../envs/coec.yaml"
    input:
        model=W.model_input,
        text=SW.holdout_text,
        candidates=SW.candidate_files,
        grams=SW.grams_input,
    output:
        keep=paths.keep_file("{model}", "{calib}", "{select}", "{ratio}"),
        record=paths.search_record_file("{model}", "{calib}", "{select}", "{ratio}"),
    wildcard_constraints:
        select=W.select_constraint(search=True),
    params:
        model=W.model_path,
        dtype=W.model_dtype,
        holdout=SW.holdout,
        group_rounding=W.group_rounding,
        options=SW.run_args,
        grams=SW.grams_arg,
        cell=lambda wc: json.dumps(dict(wc.items()), sort_keys=True),
        device=W.device,
        expect=W.expect,
        hub=W.hub,
        **SW.plugin_params("search"),
    log:
        paths.log_file("search", "{model}", "{calib}", "{select}-{ratio}"),
    benchmark:
        paths.benchmark_file("search", "{model}", "{calib}", "{select}-{ratio}")
    threads: W.threads("ppl")
    resources:
        **W.rule_resources("ppl"),
    shell:
        "OMP_NUM_THREADS={threads} {PY} search run --model {params.model:q} --candidates {input.candidates:q} "
        "--holdout {params.holdout:q} --ratio {wildcards.ratio:q} --group-rounding {params.group_rounding:q} "
        "{params.options} {params.grams} --dtype {params.dtype:q} --device {params.device:q} "
        "--cell {params.cell:q} --expect {params.expect:q} {params.hub} "
        "--out {output.keep:q} --record {output.record:q} > {log:q} 2>&1"
