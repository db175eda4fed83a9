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


rule appC:
    conda:
        "../../envs/coec.yaml"
    input:
        lambda wc: targets.appc_geometry(config),
    output:
        csv=report("results/appC.csv", caption="../report/appc.rst", category="Geometry",
                   labels=lambda wc: targets.report_label(config, "results/appC.csv")),
        md="results/appC.md",
        png=report("results/figures/appC_angles.png", caption="../report/appc_angles.rst",
                   category="Geometry",
                   labels=lambda wc: targets.report_label(config, "results/figures/appC_angles.png")),
    params:
        spec=lambda wc: json.dumps(targets.appc_spec(config)),
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
        lambda wc: targets.table4_inputs(config),
    output:
        csv=report("results/table4.csv", caption="../report/table4.rst", category="Tables",
                   subcategory="Deployment cost",
                   labels=lambda wc: targets.report_label(config, "results/table4.csv")),
        md="results/table4.md",
    params:
        spec=lambda wc: json.dumps(targets.table4_spec(config)),
    log:
        "results/logs/report/table4.log",
    benchmark:
        "results/benchmarks/report/table4.tsv"
    resources:
        **rule_resources("report"),
    shell:
        "{PY} report --kind table4 --spec {params.spec:q} --out {output.csv:q} > {log:q} 2>&1"


rule fig2:
    conda:
        "../../envs/coec.yaml"
    input:
        lambda wc: targets.figure_inputs(targets.fig2_spec(config)),
    output:
        report("results/figures/fig2_calibration_size.png", caption="../report/fig2.rst",
               category="Figures",
               labels=lambda wc: targets.report_label(config, "results/figures/fig2_calibration_size.png")),
    params:
        spec=lambda wc: json.dumps(targets.fig2_spec(config)),
    log:
        "results/logs/report/fig2.log",
    benchmark:
        "results/benchmarks/report/fig2.tsv"
    resources:
        **rule_resources("report"),
    shell:
        "{PY} report --kind lines-figure --spec {params.spec:q} --out {output:q} > {log:q} 2>&1"
