"""The blend method in the workflow (its math: tests/unit/test_compensate_methods_blend.py): a
blend cell plans its base cell and its held-out calibration, runs (the shared run's cell), and
``--until compensate`` plans the base cells it reads."""

from __future__ import annotations

import json

import yaml

from coec.io.artifacts import read_comp_block
from conftest import job_counts, run_env, snakemake, write_trimmed_workflow


def test_trimmed_workflow_blend_cell(shared_run, tmp_path):
    """A blend cell plans its base cell and the held-out calibration, runs, and its block holds
    the base's kept shapes plus a bias; its beta is in [0, 1] and its held-out error is the lowest."""
    rows = [{"selection": "wanda_sp", "compensation": "blend"}]
    cfg = dict(shared_run.cfg, table1=dict(shared_run.cfg["table1"], rows=rows))
    path = shared_run.write_config(tmp_path / "blend.yaml", cfg)
    work = shared_run.fresh(tmp_path / "work")
    plan = snakemake(work, "-n", "results/table1.csv", "--configfile", str(path), env=run_env())
    counts = job_counts(plan.stdout)
    assert counts["calibrate"] == 2 and counts["compensate"] == 2 and counts["compensate_base"] == 2  # 2 blocks each
    # the shared run (tests/conftest.py::shared_config): its wanda_sp blend cell, base coec, held-out set c8h
    assert shared_run.cfg["compensations"]["blend"] == {"method": "blend", "base": "coec", "holdout": "c8h"}
    cell = shared_run.work / "results/tiny/c8/wanda_sp-0.5"
    blend, base = (
        read_comp_block(cell / "blend/block0-0.safetensors"),
        read_comp_block(cell / "coec/block0-0.safetensors"),
    )
    for module in ("o_proj", "down_proj"):
        assert blend[f"layer0.{module}.weight"].shape == base[f"layer0.{module}.weight"].shape
        assert f"layer0.{module}.bias" in blend
    info = json.loads((cell / "blend/block0-0.json").read_text())
    for module in ("o_proj", "down_proj"):
        i = info[f"layer0.{module}"]
        assert 0.0 <= i["beta"] <= 1.0
        assert i["heldout_relerr"] <= min(i["heldout_relerr_base"], i["heldout_relerr_ridge"]) + 1e-6
    assert json.loads((cell / "blend/ppl.json").read_text())["ppl"] > 1


def test_until_compensate_plans_the_base_cells_blend_reads(tmp_path):
    """``snakemake --until compensate`` stops after the compensations, blend's included: its base's
    blocks come from rule compensate_base, whose jobs (unlike those of the rule --until names)
    release the jobs after them; a config without blend has no compensate_base job."""
    cfg, path = write_trimmed_workflow(tmp_path)
    cfg["calibration"]["c8h"] = dict(cfg["calibration"]["c8"], seed=1, disjoint_from="c8")
    cfg["compensations"]["blend"] = {"method": "blend", "base": "coec", "holdout": "c8h"}
    cfg["table1"]["rows"] = [
        {"selection": "wanda_sp", "compensation": "blend"},
        {"selection": "flap", "compensation": "coec"},  # a cell of the base no blend reads
    ]
    path.write_text(yaml.safe_dump(cfg))
    res = snakemake(tmp_path, "-n", "--until", "compensate", "--configfile", str(path), check=False)
    assert res.returncode == 0 and "Out of jobs ready" not in res.stdout + res.stderr, res.stderr[-2000:]
    assert job_counts(res.stdout) == {
        "calibrate": 2,  # the calibration and blend's held-out set
        "gram_check": 1,
        "select": 2,
        "compensate": 4,  # blend and the flap cell's coec: 2 layers, one block each
        "compensate_base": 2,  # the coec blocks blend reads
        "total": 11,
    }
    cfg["table1"]["rows"] = [{"selection": "wanda_sp", "compensation": "coec"}]
    del cfg["compensations"]["blend"]
    path.write_text(yaml.safe_dump(cfg))
    counts = job_counts(snakemake(tmp_path, "-n", "--until", "compensate", "--configfile", str(path)).stdout)
    assert counts["compensate"] == 2 and "compensate_base" not in counts
