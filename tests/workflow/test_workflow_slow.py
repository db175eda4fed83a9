"""The slow tests of test_workflow.py: the one real dry run of the paper grid (about 11,000 jobs),
whose job counts the default tier takes from the planning functions (test_paper_grid_jobs_from_the_plan);
set slow for the whole file (CI's slow steps, or `pytest -m slow`)."""

from __future__ import annotations

import pytest

from conftest import REPO, job_counts, snakemake
from test_workflow import PAPER_TABLES, paper_config, planned_job_counts, planned_threads

pytestmark = pytest.mark.slow


def test_paper_grid_dry_run(tmp_path):
    """Snakemake's own DAG of the paper grid: the jobs per rule the planning functions count, and
    every job's threads (OMP_NUM_THREADS) the CPUs it asks SLURM for."""
    res = snakemake(
        tmp_path,
        "-n",
        "-p",
        "--cores",
        "64",
        *(f"results/{t}.csv" for t in PAPER_TABLES),
        "--configfile",
        str(REPO / "workflow/configs/paper.yaml"),
    )
    counts = job_counts(res.stdout)
    planned = planned_job_counts(paper_config())
    assert {rule: counts.get(rule, 0) for rule in planned} == planned
    assert "prepare_model" not in counts  # hub models are not workflow outputs
    # threads (OMP_NUM_THREADS) = the CPUs each job asks SLURM for: cpus_per_task on CPU jobs,
    # gpu x cpus_per_gpu on GPU jobs (every evaluation streams on one GPU: 4 threads)
    jobs = planned_threads(res.stdout)
    assert len(jobs) == counts["total"]
    for rule, omp, r in jobs:
        want = int(r["gpu"]) * int(r["cpus_per_gpu"]) if int(r["gpu"]) else int(r["cpus_per_task"])
        assert omp == want, (rule, omp, r)
    assert {omp for rule, omp, _ in jobs if rule == "ppl_cell"} == {4}
