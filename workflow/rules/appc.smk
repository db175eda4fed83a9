# App. C: the geometry of a cell (principal angles of its read frames, coec.evaluate.geometry) and the
# App. C summary table and figure.


rule geometry:
    conda:
        "../../envs/coec.yaml"
    input:
        model=W.model_input,
        keep=rules.select.output[0],
        comp=W.comp_files,
    output:
        f"{CELL}/geometry.csv",
    params:
        model=W.model_path,
        expect=W.expect,
        hub=W.hub,
        **W.plugin_params("geometry"),
    log:
        paths.log_file("geometry", CELL_LOG),
    benchmark:
        paths.benchmark_file("geometry", CELL_LOG)
    threads: W.threads("report")
    resources:
        **W.rule_resources("report"),
    shell:
        "OMP_NUM_THREADS={threads} {PY} geometry --model {params.model:q} --keep {input.keep:q} "
        "--comp {input.comp:q} --expect {params.expect:q} {params.hub} --out {output:q} > {log:q} 2>&1"


rule appC:
    conda:
        "../../envs/coec.yaml"
    input:
        lambda wc: targets.appc_geometry(W.config),
    output:
        csv=report_output(paths.table_file("appC"), "appc.rst", "Geometry"),
        md=paths.table_file("appC", "md"),
        png=report_output(paths.figure_file("appC_angles"), "appc_angles.rst", "Geometry"),
    params:
        spec=lambda wc: json.dumps(targets.appc_spec(W.config)),
    log:
        paths.log_file("report", "appC"),
    benchmark:
        paths.benchmark_file("report", "appC")
    resources:
        **W.rule_resources("report"),
    shell:
        "({PY} report --kind appc --spec {params.spec:q} --out {output.csv:q} && "
        "{PY} report --kind geometry-figure --spec {params.spec:q} --out {output.png:q}) > {log:q} 2>&1"
