"""An aligned-width selection variant in the workflow: its own cells' path, its select job's
arguments (none for the paper's selections, so their params stay as they were), its keep.json,
and a change of its multiple replanning only its selection."""

from __future__ import annotations

import copy
import re

from coec.io import artifacts
from conftest import ALIGNED, job_counts, run_env, snakemake

VARIANT = "results/tiny/c8/rcpu-a16-0.5/keep.json"


def _select_commands(output: str) -> dict[str, str]:
    """keep.json path -> the `coec select` command of every select job a dry run with -p printed."""
    cmds = re.findall(r"coec select .*?--out (\S+)", output)
    lines = [line for line in output.splitlines() if "coec select " in line]
    return dict(zip(cmds, lines))


def test_aligned_variant_plans_its_own_select_job(shared_run, tmp_path):
    """The shared config's rows: wanda_sp, flap, rcpu and rcpu-a16 (tests/conftest.py::ALIGNED) cells."""
    work = shared_run.fresh(tmp_path / "work")
    path = shared_run.cfg_path
    res = snakemake(work, "-n", "-p", "--cores", "1", "results/table1.csv", "--configfile", str(path), env=run_env())
    cmds = _select_commands(res.stdout)
    assert set(cmds) == {f"results/tiny/c8/{s}-0.5/keep.json" for s in ("wanda_sp", "flap", "rcpu", "rcpu-a16")}
    assert "--method rcpu --options '{}' --channel-multiple 16 --channel-rounding floor" in cmds[VARIANT]
    assert all("--channel-" not in c for p, c in cmds.items() if p != VARIANT)
    assert "results/tiny/c8/rcpu-a16-0.5/rcpu/ppl.json" in res.stdout


def test_aligned_variant_runs_and_replans_alone(shared_run, tmp_path):
    """The shared run's rcpu-a16 selection (tests/conftest.py::ALIGNED) beside the paper's rcpu."""
    work = shared_run.work
    targets = [VARIANT, "results/tiny/c8/rcpu-0.5/keep.json"]
    keep = artifacts.read_keep(work / VARIANT)
    d_ff = keep["d_ff"]
    kept = 16 * (int(0.5 * d_ff) // 16)
    assert (keep["channel_multiple"], keep["channel_rounding"]) == (16, "floor")
    assert keep["realised_channel_ratio"] == (d_ff - kept) / d_ff
    assert all(len(k["channels"]) == kept for k in keep["layers"])
    assert "channel_multiple" not in (work / targets[1]).read_text()

    res = snakemake(work, "-n", *targets, "--configfile", str(shared_run.cfg_path), env=run_env())
    assert "Nothing to be done" in res.stdout + res.stderr
    cfg = copy.deepcopy(shared_run.cfg)
    cfg["selections"]["rcpu-a16"] = dict(ALIGNED, channel_multiple=8)
    a8 = shared_run.write_config(tmp_path / "a8.yaml", cfg)
    res = snakemake(work, "-n", *targets, "--configfile", str(a8), env=run_env())
    assert job_counts(res.stdout) == {"select": 1, "total": 1}
    wildcards = re.findall(r"^\s+wildcards: (.*)$", res.stdout, re.M)
    assert len(wildcards) == 1 and "select=rcpu-a16," in wildcards[0], wildcards
