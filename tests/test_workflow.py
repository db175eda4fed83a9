"""The Snakemake workflow: config validation, a dry run of the paper grid, and a trimmed real
run on a tiny random model (calibrate -> select -> compensate -> ppl -> table1)."""

from __future__ import annotations

import csv
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from conftest import CORPUS, make_model_dir

REPO = Path(__file__).resolve().parents[1]


def snakemake(workdir: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "snakemake", "--snakefile", str(REPO / "Snakefile"),
           "--directory", str(workdir), *args]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    if check and res.returncode:
        raise AssertionError(f"snakemake failed ({res.returncode}):\n{res.stdout[-4000:]}\n"
                             f"{res.stderr[-4000:]}")
    return res


def job_counts(output: str) -> dict[str, int]:
    """Parse Snakemake's 'Job stats' table."""
    block = output.split("Job stats:")[1]
    counts = {}
    for line in block.splitlines()[3:]:
        m = re.match(r"^(\w+)\s+(\d+)$", line.strip())
        if not m:
            break
        counts[m.group(1)] = int(m.group(2))
    return counts


def test_paper_grid_dry_run(tmp_path):
    res = snakemake(tmp_path, "-n", "results/table1.csv", "results/appA_ppl.csv",
                    "--configfile", str(REPO / "workflow/configs/paper.yaml"))
    counts = job_counts(res.stdout)
    # 6 models x (1 dense + 3 selections x 3 ratios x 2 compensations) evaluations
    assert counts["calibrate"] == 6
    assert counts["select"] == 6 * 3 * 3
    assert counts["ppl_dense"] == 6
    assert counts["ppl_cell"] == 6 * 3 * 3 * 2
    # one GPU job per (cell, layer) for every non-trivial compensation
    layers = 32 + 80 + 28 + 48 + 64 + 80
    assert counts["compensate"] == layers * 3 * 5  # 5 non-"none" cells per ratio
    assert "prepare_model" not in counts  # hub models are not workflow outputs


def test_bad_config_one_line(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("group_rounding: sideways\n")
    res = snakemake(tmp_path, "-n", "results/table1.csv", "--configfile", str(bad), check=False)
    assert res.returncode != 0
    assert "bad value at group_rounding" in res.stderr + res.stdout
    bad.write_text("evaluation: {ppl_seqlen: 128, ppl_dataset: enwiki, ppl_sequence: 3}\n")
    res = snakemake(tmp_path, "-n", "results/table1.csv", "--configfile", str(bad), check=False)
    assert "unknown key under evaluation" in res.stderr + res.stdout


@pytest.fixture(scope="module")
def trimmed_run(tmp_path_factory):
    """A real run of the whole chain on a tiny Llama and local text, then table1."""
    work = tmp_path_factory.mktemp("wf")
    model = make_model_dir(work / "tiny-llama", "llama")
    (work / "calib.txt").write_text(CORPUS)
    (work / "eval.txt").write_text(CORPUS[1000:4000])
    cfg = {
        "models": {"tiny": {"source": str(model), "num_layers": 2, "dtype": "float32"}},
        "datasets": {"local": {"source": "files", "calib": str(work / "calib.txt"),
                               "eval": str(work / "eval.txt")}},
        "calibration": {"c8": {"dataset": "local", "nsamples": 8, "seqlen": 32, "seed": 0,
                               "batch_size": 4}},
        "evaluation": {"ppl_dataset": "local", "ppl_seqlen": 32, "ppl_max_windows": 6,
                       "ppl_batch_size": 2},
        "compensations": {"coec": {"method": "coec", "alpha": 0.9, "max_rounds": 3,
                                   "o_proj": {"align_lambda": 50.0, "anchor_rank": 4}}},
        "compute": {"device": "cpu", "compensate_block": 1},
        "table1": {"calibration": "c8", "models": ["tiny"], "ratios": [0.5],
                   "rows": [{"selection": "wanda_sp", "compensation": "none"},
                            {"selection": "wanda_sp", "compensation": "coec"},
                            {"selection": "flap", "compensation": "bias"},
                            {"selection": "rcpu", "compensation": "rcpu"}]},
    }
    cfg_path = work / "trim.yaml"
    cfg_path.write_text(yaml.safe_dump(cfg))
    snakemake(work, "--cores", "2", "results/table1.csv", "--configfile", str(cfg_path))
    return work, cfg, cfg_path


def test_trimmed_run_table1(trimmed_run):
    work, _, _ = trimmed_run
    rows = list(csv.DictReader((work / "results/table1.csv").open()))
    assert [(r["selection"], r["compensation"]) for r in rows] == [
        ("dense", "dense"), ("Wanda-sp", "–"), ("Wanda-sp", "COEC"), ("FLAP", "bias"),
        ("RCPU", "RCPU")]
    for r in rows:
        assert float(r["tiny"]) > 1.0
    assert (work / "results/table1.md").read_text().count("|") > 10
    keep = yaml.safe_load((work / "results/tiny/c8/wanda_sp-0.5/keep.json").read_text())
    assert all(len(l["kv_groups"]) == 1 and len(l["channels"]) == 24 for l in keep["layers"])
    assert (work / "results/tiny/c8/wanda_sp-0.5/coec/block1-1.safetensors").is_file()
    ppl = yaml.safe_load((work / "results/tiny/c8/wanda_sp-0.5/coec/ppl.json").read_text())
    assert ppl["seqlen"] == 32 and ppl["tokens_scored"] == ppl["windows"] * 31
    assert not list((work / "results").rglob("*.tmp"))


def test_changing_ppl_seqlen_replans_only_evaluation(trimmed_run):
    work, cfg, cfg_path = trimmed_run
    res = snakemake(work, "-n", "results/table1.csv", "--configfile", str(cfg_path))
    assert "Nothing to be done" in res.stdout + res.stderr
    cfg = dict(cfg, evaluation=dict(cfg["evaluation"], ppl_seqlen=16))
    changed = work / "changed.yaml"
    changed.write_text(yaml.safe_dump(cfg))
    res = snakemake(work, "-n", "results/table1.csv", "--configfile", str(changed))
    counts = job_counts(res.stdout)
    assert set(counts) == {"ppl_dense", "ppl_cell", "table", "total"}
    assert counts["ppl_cell"] == 4 and counts["ppl_dense"] == 1


def test_changing_a_coec_option_replans_only_coec_cells(trimmed_run):
    work, cfg, _ = trimmed_run
    comps = dict(cfg["compensations"])
    comps["coec"] = dict(comps["coec"], max_rounds=2)
    changed = work / "coec_changed.yaml"
    changed.write_text(yaml.safe_dump(dict(cfg, compensations=comps)))
    res = snakemake(work, "-n", "results/table1.csv", "--configfile", str(changed))
    counts = job_counts(res.stdout)
    assert counts == {"compensate": 2, "ppl_cell": 1, "table": 1, "total": 4}  # 2 layer jobs
