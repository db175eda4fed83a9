# Iterative multi-domain FLAP (src/coec/iterative.py, docs/iterative.md).
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

import re

from coec.iterative import make_schedule as it_make_schedule

IT = config.get("iterative", {})
IT_MIXES = IT.get("mixes", {})
IT_VARIANTS = IT.get("variants", {})
IT_DOMAINS = config.get("domains", {})


def it_alternatives(names):
    """A regex matching exactly the given names (never matching when there are none)."""
    return "|".join(re.escape(n) for n in names) or "(?!x)x"


def it_check_config():
    both = sorted(set(IT_MIXES) & set(config["calibration"]))
    if both:
        raise ValueError(f"config: iterative.mixes {both} also name calibration entries")
    for name, mix in IT_MIXES.items():
        for d in mix["domains"]:
            if d not in IT_DOMAINS:
                raise ValueError(f"config: iterative.mixes.{name}.domains names unknown domain "
                                 f"{d!r} (known: {', '.join(IT_DOMAINS) or 'none'})")
    for name, dom in IT_DOMAINS.items():
        if dom["source"] == "dataset" and dom.get("dataset") not in config["datasets"]:
            raise ValueError(f"config: domains.{name}.dataset names unknown dataset "
                             f"{dom.get('dataset')!r}")


def it_sized(calib, n):
    """Name of calibration or mix `calib` resized to n sequences (itself when n is its size)."""
    return sized_calibration(calib, n, IT_MIXES if calib in IT_MIXES else None)


def it_size_base():
    f = IT["calibration_size"]
    return f.get("calibration", IT.get("table", {}).get("calibration"))


# calibration-size figure: its resized calibrations and mixes exist before the rules are defined
if "calibration_size" in IT:
    if it_size_base() is None:
        raise ValueError("config: iterative.calibration_size needs a calibration "
                         "(or iterative.table.calibration)")
    for _row in IT["calibration_size"]["rows"]:
        for _n in IT["calibration_size"]["nsamples"]:
            it_sized(_row.get("calibration", it_size_base()), _n)

it_check_config()


# ----------------------------------------------------------------------------- helpers
def it_calib_cfg(name):
    if name in IT_MIXES:
        return IT_MIXES[name]
    if name in config["calibration"]:
        return config["calibration"][name]
    raise ValueError(f"unknown calibration {name!r}: not in calibration nor iterative.mixes")


def it_domain_spec(name):
    """The data.load_split spec of a domain's calibration text."""
    d = IT_DOMAINS[name]
    if d["source"] == "dataset":
        return dataset_spec(d["dataset"])
    return {"source": "files", "calib": f"resources/domains/{name}/calib.txt"}


def it_domains(calib):
    """[{name, alpha, dataset}] of an iterative calibration (one domain for `calibration`)."""
    if calib in IT_MIXES:
        return [{"name": d, "alpha": float(a), "dataset": it_domain_spec(d)}
                for d, a in IT_MIXES[calib]["domains"].items()]
    ds = it_calib_cfg(calib)["dataset"]
    return [{"name": ds, "alpha": 1.0, "dataset": dataset_spec(ds)}]


def it_text_inputs(wc):
    if wc.calib not in IT_MIXES:
        return dataset_input(it_calib_cfg(wc.calib)["dataset"])
    files = []
    for d in IT_MIXES[wc.calib]["domains"]:
        dom = IT_DOMAINS[d]
        files += (dataset_input(dom["dataset"]) if dom["source"] == "dataset"
                  else [f"resources/domains/{d}/calib.txt"])
    return files


def it_calib_params():
    """params shared by the rules that run a calibration pass."""
    c = lambda wc: it_calib_cfg(wc.calib)
    return dict(
        model=lambda wc: model_path(wc.model),
        domains=lambda wc: json.dumps(it_domains(wc.calib), sort_keys=True),
        nsamples=lambda wc: c(wc)["nsamples"],
        seqlen=lambda wc: c(wc)["seqlen"],
        seed=lambda wc: c(wc).get("seed", 0),
        batch=lambda wc: c(wc).get("batch_size", 8),
        gram_dtype=lambda wc: c(wc).get("gram_dtype", "float32"),
        variance_mix=lambda wc: c(wc).get("variance_mix", "pooled"),
        dtype=lambda wc: model_cfg(wc.model).get("dtype", "float32"),
        device=config.get("compute", {}).get("device", "auto"),
        expect=lambda wc: model_expect(wc.model, f"{it_calib_key(wc.calib)}.seqlen"),
        hub=lambda wc: hub_args(wc.model),
    )


def it_calib_key(name):
    """The config key of a calibration entry or an iterative mix."""
    return f"iterative.mixes.{name}" if name in IT_MIXES else f"calibration.{name}"


IT_CALIB_ARGS = (
    "--model {params.model:q} --domains {params.domains:q} --nsamples {params.nsamples:q} "
    "--seqlen {params.seqlen:q} --seed {params.seed:q} --batch-size {params.batch:q} "
    "--dtype {params.dtype:q} --gram-dtype {params.gram_dtype:q} "
    "--variance-mix {params.variance_mix:q} --device {params.device:q} --expect {params.expect:q} {params.hub}"
)


def it_variant(name):
    if name not in IT_VARIANTS:
        raise ValueError(f"unknown iterative variant {name!r} (known: {', '.join(IT_VARIANTS)})")
    return IT_VARIANTS[name]


def it_method(variant):
    v = it_variant(variant)
    return f"{v.get('mode', 'global')}-{v.get('structure', 'uniform')}"


def it_chain(variant, ratio):
    """The step folders of a cell, e.g. ['0.1', '0.1/0.2', '0.1/0.2/0.3']."""
    v = it_variant(variant)
    sched = [fmt_ratio(r) for r in it_make_schedule(float(ratio), v.get("steps"), v.get("step"))]
    return ["/".join(sched[: s + 1]) for s in range(len(sched))]


def it_steps_dir(model, calib, method):
    return f"results/{model}/{calib}/iterative/{method}/steps"


def it_cell_steps(wc):
    base = it_steps_dir(wc.model, wc.calib, it_method(wc.variant))
    return [f"{base}/{c}" for c in it_chain(wc.variant, wc.ratio)]


def it_parent(wc):
    """The previous step's folder of a step, or None for a first step."""
    head = wc.chain.rsplit("/", 1)
    return None if len(head) == 1 else f"{it_steps_dir(wc.model, wc.calib, wc.method)}/{head[0]}"


def it_block_name(model):
    return f"block0-{model_cfg(model)['num_layers'] - 1}.safetensors"


def it_cell_dir(model, calib, variant, ratio):
    return f"results/{model}/{calib}/iterative/{variant}-{fmt_ratio(ratio)}"


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
        "OMP_NUM_THREADS={threads} {PY} iterative grams " + IT_CALIB_ARGS + " --out {output:q} > {log:q} 2>&1"


ruleorder: iterative_grams > calibrate


rule iterative_step:
    conda:
        "../../envs/coec.yaml"
    input:
        model=model_input,
        text=it_text_inputs,
        parent=lambda wc: [] if it_parent(wc) is None else [
            f"{it_parent(wc)}/{f}" for f in ("keep.json", "bias.safetensors", "state.safetensors")],
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
        group_rounding=config.get("group_rounding", "ceil"),
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
        "OMP_NUM_THREADS={threads} {PY} iterative run " + IT_CALIB_ARGS + " --schedule {params.ratio:q} {params.init} "
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
        variant=lambda wc: json.dumps(it_variant(wc.variant), sort_keys=True),
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
        comp=lambda wc: f"{it_cell_dir(wc.model, wc.calib, wc.variant, wc.ratio)}/{it_block_name(wc.model)}",
    output:
        "results/{model}/{calib}/iterative/{variant}-{ratio}/ppl.json",
    wildcard_constraints:
        variant=it_alternatives(IT_VARIANTS),
    params:
        model=lambda wc: model_path(wc.model),
        dtype=lambda wc: model_cfg(wc.model).get("dtype", "float32"),
        # per-layer widths differ under AL-AM: evaluated in memory by `iterative ppl`
        cmd=lambda wc: "ppl" if it_variant(wc.variant).get("structure", "uniform") == "uniform"
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
def it_row_file(model, calib, row, ratio, filename):
    """A table/figure row's result file: an iterative cell (variant) or a workflow cell
    (selection + compensation) on calibration `calib`."""
    if "variant" in row:
        return f"{it_cell_dir(model, calib, row['variant'], ratio)}/{filename}"
    return f"{cell_dir(model, calib, row['selection'], ratio, row['compensation'])}/{filename}"


def it_table_spec(filename="ppl.json", metric="ppl"):
    """Rows (ratio x method) of table_iterative: workflow cells (selection + compensation on the
    table's calibration) and iterative cells (variant on a calibration or mix)."""
    t = IT["table"]
    models = t["models"]
    rows = [{"labels": {"ratio": 0.0, "method": "dense"},
             "cells": {m: f"results/{m}/dense/{filename}" for m in models}}]
    for r in t["ratios"]:
        for row in t["rows"]:
            calib = row.get("calibration", t["calibration"])
            cells = {m: it_row_file(m, calib, row, r, filename) for m in models}
            rows.append({"labels": {"ratio": float(r), "method": row["label"]}, "cells": cells})
    mixes = {n: IT_MIXES[n] for n in sorted({row.get("calibration") for row in t["rows"]} & set(IT_MIXES))}
    return {"metric": metric, "digits": 2 if metric == "ppl" else 4, "models": models,
            "label_columns": ["ratio", "method"], "rows": rows,
            "caption": f"table_iterative: {metric} | calibration {t['calibration']} | mixes "
                       f"{json.dumps(mixes, sort_keys=True)} | variants "
                       f"{json.dumps(IT_VARIANTS, sort_keys=True)} | evaluation "
                       f"{json.dumps(config['evaluation'], sort_keys=True)}"}


rule table_iterative:
    conda:
        "../../envs/coec.yaml"
    input:
        lambda wc: sorted({p for row in it_table_spec()["rows"] for p in row["cells"].values()}),
    output:
        csv=report("results/table_iterative.csv", caption="../report/table.rst", category="Iterative",
                   labels=lambda wc: report_label("results/table_iterative.csv")),
        md="results/table_iterative.md",
    params:
        spec=lambda wc: json.dumps(it_table_spec()),
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
        comp=lambda wc: f"{it_cell_dir(wc.model, wc.calib, wc.variant, wc.ratio)}/{it_block_name(wc.model)}",
    output:
        **zs_outputs("results/{model}/{calib}/iterative/{variant}-{ratio}"),
    wildcard_constraints:
        variant=it_alternatives(IT_VARIANTS),
    params:
        model=lambda wc: model_path(wc.model),
        dtype=lambda wc: model_cfg(wc.model).get("dtype", "float32"),
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
        lambda wc: sorted({p for row in it_table_spec("zeroshot.json", "mean7")["rows"]
                           for p in row["cells"].values()}),
    output:
        csv=report("results/table_iterative_zeroshot.csv", caption="../report/table.rst",
                   category="Iterative",
                   labels=lambda wc: report_label("results/table_iterative_zeroshot.csv")),
        md="results/table_iterative_zeroshot.md",
    params:
        spec=lambda wc: json.dumps(it_table_spec("zeroshot.json", "mean7")),
    log:
        "results/logs/report/table_iterative_zeroshot.log",
    benchmark:
        "results/benchmarks/report/table_iterative_zeroshot.tsv"
    resources:
        **rule_resources("report"),
    shell:
        "{PY} report --kind table --spec {params.spec:q} --out {output.csv:q} > {log:q} 2>&1"


# ----------------------------------------------------------------------------- figure
def it_size_spec():
    """Seed Fig. 2: perplexity against calibration size N, one panel per ratio, one line per
    row; every row's calibration (or mix) is resized to N and everything downstream recomputed."""
    f = IT["calibration_size"]
    base = it_size_base()
    panels = {}
    for r in f["ratios"]:
        panels[f"{round(float(r) * 100)} % width pruned"] = {
            row["label"]: [[n, it_row_file(f["model"], it_sized(row.get("calibration", base), n),
                                           row, r, "ppl.json")] for n in f["nsamples"]]
            for row in f["rows"]}
    calibs = sorted({row.get("calibration", base) for row in f["rows"]})
    return size_figure_spec(
        panels, it_calib_cfg(base)["seqlen"],
        f"iterative calibration size: {f['model']}, calibrations {', '.join(calibs)} "
        f"resized to N, selection recomputed at each N; variants "
        f"{json.dumps(IT_VARIANTS, sort_keys=True)}; eval "
        f"{config['evaluation']['ppl_dataset']} seqlen {config['evaluation']['ppl_seqlen']}")


rule iterative_calibration_size:
    conda:
        "../../envs/coec.yaml"
    input:
        lambda wc: figure_inputs(it_size_spec()),
    output:
        report("results/figures/iterative_calibration_size.png",
               caption="../report/iterative_size.rst", category="Iterative",
               labels=lambda wc: report_label("results/figures/iterative_calibration_size.png")),
    params:
        spec=lambda wc: json.dumps(it_size_spec()),
    log:
        "results/logs/report/iterative_calibration_size.log",
    benchmark:
        "results/benchmarks/report/iterative_calibration_size.tsv"
    resources:
        **rule_resources("report"),
    shell:
        "{PY} report --kind lines-figure --spec {params.spec:q} --out {output:q} > {log:q} 2>&1"
