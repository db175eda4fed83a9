"""The Snakemake workflow: config validation, a dry run of the paper grid, and a trimmed real
run on a tiny random model (calibrate -> select -> compensate -> ppl -> table1)."""

from __future__ import annotations

import csv
import re
from pathlib import Path
from types import SimpleNamespace

import yaml

from conftest import REPO, job_counts, run_env, snakemake


def planned_threads(output: str) -> list[tuple[str, int, dict]]:
    """(rule, OMP_NUM_THREADS of its shell command, resources) of every job a dry run with -p printed."""
    jobs = []
    for block in output.split("\nrule ")[1:]:
        omp = re.search(r"OMP_NUM_THREADS=(\d+) ", block)
        res = re.search(r"^\s+resources: (.*)$", block, re.M)
        if omp and res:
            jobs.append(
                (
                    block.split(":", 1)[0].strip(),
                    int(omp.group(1)),
                    dict(kv.split("=", 1) for kv in res.group(1).split(", ")),
                )
            )
    return jobs


# ----------------------------------------------------------------------------- the paper grid, planned
#: the paper grid's targets (tables) of the job counts below and of the slow tier's real dry run
#: (tests/workflow/test_workflow_slow.py)
PAPER_TABLES = ("table1", "appA_ppl")
#: the threads keys of each stage's rules (workflow/rules/*.smk: ``threads: W.threads(stage, keys)``)
STAGE_THREADS = {
    "calibrate": ("calibrate_threads", "threads"),
    "select": ("threads",),
    "compensate": ("threads",),
    "ppl": ("threads",),
    "zeroshot": ("threads",),
    "report": ("threads",),
    "prepare": ("threads",),
}


def paper_config(*extra: dict) -> dict:
    """config.yaml with workflow/configs/paper.yaml (and ``extra``) merged over it as Snakemake
    merges --configfile files, validated (defaults filled) as the workflow validates it."""
    from coec.config.validate import validate_config

    def merge(a: dict, b: dict) -> dict:
        for k, v in b.items():
            if isinstance(v, dict) and isinstance(a.get(k), dict):
                merge(a[k], v)
            else:
                a[k] = v
        return a

    cfg = yaml.safe_load((REPO / "config.yaml").read_text())
    for more in (yaml.safe_load((REPO / "workflow/configs/paper.yaml").read_text()), *extra):
        merge(cfg, more)
    return validate_config(cfg)


def planned_job_counts(config: dict, tables=PAPER_TABLES) -> dict[str, int]:
    """Jobs per rule that the tables' targets need, from the pure planning functions: the result
    files each table reads (``coec.workflow.targets.table_inputs``), one dense KL reference per
    model with a perplexity job (docs/kl.md), a model's compensation
    blocks (``Wiring.blocks``: one job per block of a cell whose method is not ``none``) and the
    model folders the workflow makes (``Wiring.model_input``: embedded models only)."""
    from coec.workflow.targets import table_inputs
    from coec.workflow.wiring import Wiring

    W = Wiring(config)
    dense, cells = set(), set()
    for f in {f for t in tables for f in table_inputs(W.config, t)}:
        # results/<model>/dense/ppl.json or results/<model>/<calib>/<select>-<ratio>/<comp>/ppl.json
        parts = Path(f).parts
        if parts[2] == "dense":
            dense.add(parts[1])
        else:
            cells.add(parts[1:5])
    models = dense | {c[0] for c in cells}
    counts = {
        "calibrate": len({c[:2] for c in cells}),
        "select": len({c[:3] for c in cells}),
        "compensate": sum(len(W.blocks(c[0])) for c in cells if W.compensation(c[3])["method"] != "none"),
        "kl_reference": len(models),  # the dense reference of each model evaluated, read by its ppl jobs
        "ppl_dense": len(dense),
        "ppl_cell": len(cells),
        "prepare_model": sum(bool(W.model_input(SimpleNamespace(model=m))) for m in models),
    }
    return {rule: n for rule, n in counts.items() if n}


def test_paper_grid_jobs_from_the_plan():
    """The paper grid's Table 1 and App. A perplexity tables, counted from the planning functions
    (the slow tier's real dry run checks these counts against Snakemake's DAG)."""
    counts = planned_job_counts(paper_config())
    # 6 models x (1 dense + 3 ratios x 11 rows: the paper's 6 plus bias and ridge under every
    # selection) evaluations
    assert counts["calibrate"] == 6
    assert counts["select"] == 6 * 3 * 3
    assert counts["ppl_dense"] == counts["kl_reference"] == 6
    assert counts["ppl_cell"] == 6 * 3 * 11
    # one GPU job per (cell, layer) for every non-trivial compensation
    layers = 32 + 80 + 28 + 48 + 64 + 80
    assert counts["compensate"] == layers * 3 * 10  # 10 non-"none" cells per ratio
    assert "prepare_model" not in counts  # hub models are not workflow outputs


def test_paper_grid_threads_are_the_cpus_each_job_asks_for():
    """threads (OMP_NUM_THREADS) = the CPUs each job asks SLURM for: cpus_per_task on CPU jobs,
    gpu x cpus_per_gpu on GPU jobs (every evaluation streams on one GPU: 4 threads), for every
    stage and model of the paper config; an explicit compute.threads wins over the resources
    (calibrate_threads 0: as threads)."""
    from coec.workflow.wiring import Wiring

    cfg = paper_config()
    W = Wiring(cfg)
    for stage, keys in STAGE_THREADS.items():
        threads, res = W.threads(stage, keys), W.rule_resources(stage)
        for model in cfg["models"]:
            wc = SimpleNamespace(model=model)
            gpu = res["gpu"](wc)
            want = gpu * res["cpus_per_gpu"](wc) if gpu else res["cpus_per_task"](wc)
            assert threads(wc) == want, (stage, model)
            if stage == "ppl" and model in cfg["table1"]["models"]:
                assert threads(wc) == 4
    fixed = Wiring(paper_config({"compute": {"threads": 3}}))
    assert {fixed.threads(stage, keys) for stage, keys in STAGE_THREADS.items()} == {3}


def test_compute_threads_win_over_the_resources(shared_run, tmp_path):
    """An explicit compute.threads is every job's OMP_NUM_THREADS, whatever CPUs its resources ask
    for (calibrate_threads 0: as threads); on the paper grid, as planned:
    test_paper_grid_threads_are_the_cpus_each_job_asks_for."""
    # config.yaml's calibrate_threads 2 set to 0, as paper.yaml does
    fixed = shared_run.write_config(tmp_path / "threads.yaml", {"compute": {"threads": 5, "calibrate_threads": 0}})
    res = snakemake(
        shared_run.fresh(tmp_path / "work"),
        "-n",
        "-p",
        "--cores",
        "64",
        "results/table1.csv",
        "--configfile",
        str(shared_run.cfg_path),
        str(fixed),
        env=run_env(),
    )
    jobs = planned_threads(res.stdout)
    assert {rule for rule, _, _ in jobs} >= {"calibrate", "select", "compensate", "ppl_cell"}
    assert {omp for _, omp, _ in jobs} == {5}


def test_bad_config_one_line(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("group_rounding: sideways\n")
    res = snakemake(tmp_path, "-n", "results/table1.csv", "--configfile", str(bad), check=False)
    assert res.returncode != 0
    assert "bad value at group_rounding" in res.stderr + res.stdout
    bad.write_text("evaluation: {ppl_seqlen: 128, ppl_dataset: enwiki, ppl_sequence: 3}\n")
    res = snakemake(tmp_path, "-n", "results/table1.csv", "--configfile", str(bad), check=False)
    assert "unknown key under evaluation" in res.stderr + res.stdout


def planned_jobs(output: str) -> list[tuple[str, str, dict]]:
    """(rule, wildcards, resources) of every job a dry run printed."""
    jobs = []
    for block in output.split("\nrule ")[1:]:
        name = block.split(":", 1)[0].strip()
        wc = re.search(r"^\s+wildcards: (.*)$", block, re.M)
        res = re.search(r"^\s+resources: (.*)$", block, re.M)
        resources = dict(kv.split("=", 1) for kv in res.group(1).split(", ")) if res else {}
        jobs.append((name, wc.group(1) if wc else "", resources))
    return jobs


def test_slurm_profile_plans_the_dag_the_local_profile_ran(shared_run, tmp_path):
    """The SLURM profile (executor plugin) plans, job for job, the DAG the local profile ran,
    with the per-model GPU resources of the config on every job."""
    work, cfg_path = shared_run.work, shared_run.cfg_path
    plans = {}
    res = snakemake(
        shared_run.fresh(tmp_path / "default"),
        "-n",
        "results/table1.csv",
        "--workflow-profile",
        str(REPO / "workflow/profiles/default"),
        "--configfile",
        str(cfg_path),
        env=run_env(),
    )
    plans["default"] = res.stdout
    # the SLURM command in the README's second form: `--` ends --configfile's list of files
    res = snakemake(
        shared_run.fresh(tmp_path / "slurm"),
        "-n",
        "--workflow-profile",
        str(REPO / "workflow/profiles/slurm"),
        "--configfile",
        str(cfg_path),
        "--",
        "results/table1.csv",
        env=run_env(),
    )
    plans["slurm"] = res.stdout
    local = sorted((r, w) for r, w, _ in planned_jobs(plans["default"]))
    slurm_jobs = planned_jobs(plans["slurm"])
    assert sorted((r, w) for r, w, _ in slurm_jobs) == local
    # compensate_base: the COEC cell's blocks, which the blend cell reads (the same job otherwise)
    comp = [(w, res) for r, w, res in slurm_jobs if r in ("compensate", "compensate_base")]
    # COEC, bias, RCPU, aligned RCPU, blend and plug-in cells x two layers, one job each
    assert len(comp) == 6 * 2 and sum(r == "compensate_base" for r, _, _ in slurm_jobs) == 2
    for _, res in comp:
        assert (res["gpu"], res["mem_mb"], res["runtime"]) == ("1", "3000", "7")
        assert (res["cpus_per_gpu"], res["cpus_per_task"], res["slurm_partition"]) == ("3", "0", "gpu")
    calib = [res for r, _, res in slurm_jobs if r == "calibrate"]
    assert calib and all((c["gpu"], c["mem_mb"]) == ("1", "5000") for c in calib)
    # the executor turns them into --cpus-per-gpu on GPU jobs, --cpus-per-task on CPU jobs
    from snakemake_executor_plugin_slurm_jobstep import get_cpu_setting

    class Res(dict):
        __getattr__ = dict.__getitem__

    def sbatch_cpus(res):
        r = Res({k: int(v) if v.isdigit() else v for k, v in res.items()})
        return get_cpu_setting(type("Job", (), {"threads": 1, "resources": r})(), r.get("gpu", 0) > 0)

    assert sbatch_cpus(comp[0][1]) == "--cpus-per-gpu=3"
    # ... and the gpu resource into --gpus (the executor's own gres helper)
    from snakemake_executor_plugin_slurm.utils import set_gres_string

    def sbatch_gpus(res):
        r = Res({k: int(v) if v.isdigit() else v for k, v in res.items()})
        r.setdefault("gres", None)
        r.setdefault("gpu_model", None)
        return set_gres_string(type("Job", (), {"resources": r})()).strip()

    assert sbatch_gpus(comp[0][1]) == "--gpus=1"
    assert sbatch_gpus(dict(comp[0][1], gpu_model="h100")) == "--gpus=h100:1"
    select = [res for r, _, res in slurm_jobs if r == "select"]
    n_task = select[0]["cpus_per_task"]
    assert select and sbatch_cpus(select[0]) == f"--cpus-per-task={n_task}"
    assert sbatch_gpus(select[0]) == ""
    assert select[0].get("slurm_partition", "") == ""  # not configured: the profile's default
    # no cpus_per_gpu configured for calibrate: the GPU job asks for cpus_per_task CPUs per GPU
    assert sbatch_cpus(calib[0]) == f"--cpus-per-gpu={n_task}"
    # every planned job is one the local run produced
    for rule, wc, _ in planned_jobs(plans["default"]):
        if rule in ("compensate", "compensate_base"):
            w = dict(kv.split("=", 1) for kv in wc.split(", "))
            assert (
                work / f"results/{w['model']}/{w['calib']}/{w['select']}-{w['ratio']}/"
                f"{w['comp']}/block{w['first']}-{w['last']}.safetensors"
            ).is_file()


def test_trimmed_run_table1(shared_run):
    work = shared_run.work
    rows = list(csv.DictReader((work / "results/table1.csv").open()))
    assert [(r["selection"], r["compensation"]) for r in rows] == [
        ("dense", "dense"),
        ("Wanda-sp", "–"),
        ("Wanda-sp", "COEC"),
        ("FLAP", "bias"),
        ("RCPU", "RCPU"),
        ("Wanda-sp", "blend"),
        ("rcpu-a16", "RCPU"),
        ("Wanda-sp", "scaled"),
    ]
    for r in rows:
        assert float(r["tiny"]) > 1.0
    assert (work / "results/table1.md").read_text().count("|") > 10
    keep = yaml.safe_load((work / "results/tiny/c8/wanda_sp-0.5/keep.json").read_text())
    assert all(len(row["kv_groups"]) == 1 and len(row["channels"]) == 24 for row in keep["layers"])
    assert (work / "results/tiny/c8/wanda_sp-0.5/coec/block1-1.safetensors").is_file()
    ppl = yaml.safe_load((work / "results/tiny/c8/wanda_sp-0.5/coec/ppl.json").read_text())
    assert ppl["seqlen"] == 32 and ppl["tokens_scored"] == ppl["windows"] * 31
    assert not list((work / "results").rglob("*.tmp"))


def test_trimmed_run_logs_have_no_logging_errors(shared_run):
    """No job of the real run hit a logging error (a message that failed to format)."""
    work = shared_run.work
    logs = sorted((work / "results/logs").rglob("*.log"))
    assert len(logs) >= 8
    bad = [str(p.relative_to(work)) for p in logs if "--- Logging error ---" in p.read_text(errors="replace")]
    assert not bad, bad
    assert "relerr" in (work / "results/logs/compensate/tiny/c8/wanda_sp-0.5/coec/block0-0.log").read_text()


def test_changing_ppl_seqlen_replans_only_evaluation(shared_run, tmp_path):
    work, cfg, cfg_path = shared_run.work, shared_run.cfg, shared_run.cfg_path
    res = snakemake(work, "-n", "results/table1.csv", "--configfile", str(cfg_path), env=run_env())
    assert "Nothing to be done" in res.stdout + res.stderr
    cfg = dict(cfg, evaluation=dict(cfg["evaluation"], ppl_seqlen=16))
    changed = shared_run.write_config(tmp_path / "changed.yaml", cfg)
    res = snakemake(work, "-n", "results/table1.csv", "--configfile", str(changed), env=run_env())
    counts = job_counts(res.stdout)
    assert set(counts) == {"kl_reference", "ppl_dense", "ppl_cell", "table", "total"}
    assert counts["ppl_cell"] == len(cfg["table1"]["rows"]) and counts["ppl_dense"] == counts["kl_reference"] == 1


def test_changing_a_coec_option_replans_only_coec_cells(shared_run, tmp_path):
    """Only the COEC cell's jobs (2 layer jobs; compensate_base, as the blend cell reads its
    blocks) and those that read them (the blend cell) are planned again."""
    work, cfg = shared_run.work, shared_run.cfg
    comps = dict(cfg["compensations"])
    comps["coec"] = dict(comps["coec"], max_rounds=2)
    changed = shared_run.write_config(tmp_path / "coec_changed.yaml", dict(cfg, compensations=comps))
    res = snakemake(work, "-n", "results/table1.csv", "--configfile", str(changed), env=run_env())
    counts = job_counts(res.stdout)
    assert counts == {"compensate_base": 2, "compensate": 2, "ppl_cell": 2, "table": 1, "total": 7}
    jobs = [(r, dict(kv.split("=", 1) for kv in w.split(", "))) for r, w, _ in planned_jobs(res.stdout) if r != "table"]
    planned = {(r, wc["comp"]) for r, wc in jobs}
    want = {("compensate_base", "coec"), ("compensate", "blend"), ("ppl_cell", "coec"), ("ppl_cell", "blend")}
    assert planned == want


def test_calibration_size_figures_share_the_base_cells(tmp_path):
    """Fig. 2 and the iterative calibration-size figure resize the base calibration to each N;
    at N = the base size they reuse the table cells instead of recalibrating."""
    res = snakemake(
        tmp_path,
        "-n",
        "results/table1.csv",
        "results/figures/fig2_calibration_size.png",
        "results/figures/iterative_calibration_size.png",
    )
    counts = job_counts(res.stdout)
    cfg = yaml.safe_load((REPO / "config.yaml").read_text())
    base = cfg["calibration"][cfg["fig2"]["calibration"]]["nsamples"]
    sizes = set(cfg["fig2"]["nsamples"]) | set(cfg["iterative"]["calibration_size"]["nsamples"])
    assert base in sizes
    holdouts = {cfg["compensations"][r["compensation"]].get("holdout") for r in cfg["table1"]["rows"]} - {None}
    # the base set once, never as "-n<base>", and the blend cells' held-out set
    assert counts["calibrate"] == len(sizes) + len(holdouts)
    assert f"-n{base}" not in res.stdout
    mixes = {
        r["calibration"]
        for r in cfg["iterative"]["calibration_size"]["rows"]
        if r.get("calibration") in cfg["iterative"]["mixes"]
    }
    for n in sizes - {base}:
        assert f"calib=enwiki-32x512-n{n}" in res.stdout
        for mix in mixes:
            assert f"calib={mix}-n{n}" in res.stdout
    f2 = cfg["fig2"]
    fig2_cells = len(f2["nsamples"]) * len(f2["ratios"]) * len(f2["compensations"])
    shared_fig2 = sum(
        1
        for row in cfg["table1"]["rows"]
        if row["selection"] == f2["selection"] and row["compensation"] in f2["compensations"]
    ) * len(set(f2["ratios"]) & set(cfg["table1"]["ratios"]))
    it = cfg["iterative"]["calibration_size"]
    flap_rows = [r for r in it["rows"] if "selection" in r]
    it_cells = len(flap_rows) * len(it["nsamples"]) * len(it["ratios"])
    shared_it = sum(
        1
        for r in flap_rows
        for t in cfg["table1"]["rows"]
        if (t["selection"], t["compensation"]) == (r["selection"], r["compensation"])
    ) * len(set(it["ratios"]) & set(cfg["table1"]["ratios"]))
    assert counts["ppl_cell"] == len(cfg["table1"]["rows"]) + fig2_cells - shared_fig2 + it_cells - shared_it
    variant_rows = [r for r in it["rows"] if "variant" in r]
    assert counts["iterative_ppl"] == len(variant_rows) * len(it["nsamples"]) * len(it["ratios"])
