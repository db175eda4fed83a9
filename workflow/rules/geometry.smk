# App. C geometry, Table 4 deployment cost, Fig. 2 calibration-size sweep.


rule geometry:
    conda:
        "../../envs/coec.yaml"
    input:
        model=model_input,
        keep="results/{model}/{calib}/{select}-{ratio}/keep.json",
        comp=comp_files,
    output:
        "results/{model}/{calib}/{select}-{ratio}/{comp}/geometry.csv",
    params:
        model=lambda wc: model_path(wc.model),
        expect=lambda wc: model_expect(wc.model),
        hub=lambda wc: hub_args(wc.model),
    log:
        "results/logs/geometry/{model}/{calib}/{select}-{ratio}/{comp}.log",
    benchmark:
        "results/benchmarks/geometry/{model}/{calib}/{select}-{ratio}/{comp}.tsv"
    threads: job_threads("report")
    resources:
        **rule_resources("report"),
    shell:
        "OMP_NUM_THREADS={threads} {PY} geometry --model {params.model:q} --keep {input.keep:q} "
        "--comp {input.comp:q} --expect {params.expect:q} {params.hub} --out {output:q} > {log:q} 2>&1"


def appc_geometry():
    c = config["appC"]
    return f"{cell_dir(c['model'], c['calibration'], c['selection'], c['ratio'], c['compensation'])}/geometry.csv"


def appc_caption():
    c = config["appC"]
    return (f"App. C geometry: {c['model']}, calibration {c['calibration']}, {c['selection']} "
            f"selection at {fmt_ratio(c['ratio'])}, compensation {c['compensation']} "
            f"({json.dumps(comp_spec(c['compensation']), sort_keys=True)}); O = original read "
            f"frame on kept coordinates, P = pruned W_K, C = compensated; o_proj r_p=16, down_proj r=64")


rule appC:
    conda:
        "../../envs/coec.yaml"
    input:
        lambda wc: appc_geometry(),
    output:
        csv=report("results/appC.csv", caption="../report/appc.rst", category="Geometry",
                   labels=lambda wc: report_label("results/appC.csv")),
        md="results/appC.md",
        png=report("results/figures/appC_angles.png", caption="../report/appc_angles.rst",
                   category="Geometry",
                   labels=lambda wc: report_label("results/figures/appC_angles.png")),
    params:
        spec=lambda wc: json.dumps({"geometry": appc_geometry(), "caption": appc_caption()}),
    log:
        "results/logs/report/appC.log",
    benchmark:
        "results/benchmarks/report/appC.tsv"
    resources:
        **rule_resources("report"),
    shell:
        "({PY} report --kind appc --spec {params.spec:q} --out {output.csv:q} && "
        "{PY} report --kind geometry-figure --spec {params.spec:q} --out {output.png:q}) > {log:q} 2>&1"


rule table4:
    conda:
        "../../envs/coec.yaml"
    input:
        lambda wc: [f"resources/models/{m}" for m in config["table4"].get("models", [])
                    if model_cfg(m)["source"] == "embedded"],
    output:
        csv=report("results/table4.csv", caption="../report/table4.rst", category="Tables",
                   subcategory="Deployment cost", labels=lambda wc: report_label("results/table4.csv")),
        md="results/table4.md",
    params:
        spec=lambda wc: json.dumps({
            "ratio": config["table4"]["ratio"],
            "group_rounding": "ceil",
            "published": config["table4"].get("published", []),
            "local": {m: str(model_path(m)) for m in config["table4"].get("models", [])},
            "caption": f"Table 4: deployment cost at {fmt_ratio(config['table4']['ratio'])} "
                       "column sparsity (ceil rounding of KV groups and channels); params in 1e9, "
                       "memory in GiB (bf16 weights + KV cache + one layer's activations at 4096 "
                       "tokens), GFLOPs per token = 2 x params"}),
    log:
        "results/logs/report/table4.log",
    benchmark:
        "results/benchmarks/report/table4.tsv"
    resources:
        **rule_resources("report"),
    shell:
        "{PY} report --kind table4 --spec {params.spec:q} --out {output.csv:q} > {log:q} 2>&1"


def fig2_spec():
    f = config["fig2"]
    panels = {}
    for r in f["ratios"]:
        panels[f"{round(float(r) * 100)} % column sparsity"] = {
            comp: [[n, f"{cell_dir(f['model'], sized_calibration(f['calibration'], n), f['selection'], r, comp)}/ppl.json"]
                   for n in f["nsamples"]]
            for comp in f["compensations"]}
    return size_figure_spec(
        panels, config["calibration"][f["calibration"]]["seqlen"],
        f"Fig. 2: perplexity vs calibration size, {f['model']}, {f['selection']} "
        f"selection recomputed at each N; eval {config['evaluation']['ppl_dataset']} "
        f"seqlen {config['evaluation']['ppl_seqlen']}")


rule fig2:
    conda:
        "../../envs/coec.yaml"
    input:
        lambda wc: figure_inputs(fig2_spec()),
    output:
        report("results/figures/fig2_calibration_size.png", caption="../report/fig2.rst",
               category="Figures",
               labels=lambda wc: report_label("results/figures/fig2_calibration_size.png")),
    params:
        spec=lambda wc: json.dumps(fig2_spec()),
    log:
        "results/logs/report/fig2.log",
    benchmark:
        "results/benchmarks/report/fig2.tsv"
    resources:
        **rule_resources("report"),
    shell:
        "{PY} report --kind lines-figure --spec {params.spec:q} --out {output:q} > {log:q} 2>&1"
