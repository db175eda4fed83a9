"""An aligned-width selection variant in the workflow: its own cells' path, its select job's
arguments (none for the paper's selections, so their params stay as they were), its keep.json,
and a change of its multiple replanning only its selection."""

from __future__ import annotations

import copy
import re

import yaml

from coec.io import artifacts
from conftest import job_counts, snakemake, write_trimmed_workflow

VARIANT = {"score": "rcpu", "channel_multiple": 16, "channel_rounding": "floor"}


def _select_commands(output: str) -> dict[str, str]:
    """keep.json path -> the `coec select` command of every select job a dry run with -p printed."""
    cmds = re.findall(r"coec select .*?--out (\S+)", output)
    lines = [line for line in output.splitlines() if "coec select " in line]
    return dict(zip(cmds, lines))


def _write(work, cfg, name):
    path = work / name
    path.write_text(yaml.safe_dump(cfg))
    return path


def test_aligned_variant_plans_runs_and_replans_alone(tmp_path):
    cfg, _ = write_trimmed_workflow(tmp_path)
    cfg = copy.deepcopy(cfg)
    cfg["selections"] = {"rcpu-a16": VARIANT}
    cfg["table1"]["rows"].append({"selection": "rcpu-a16", "compensation": "rcpu"})
    path = _write(tmp_path, cfg, "aligned.yaml")
    res = snakemake(tmp_path, "-n", "-p", "--cores", "1", "results/table1.csv", "--configfile", str(path))
    cmds = _select_commands(res.stdout)
    variant = "results/tiny/c8/rcpu-a16-0.5/keep.json"
    assert set(cmds) == {f"results/tiny/c8/{s}-0.5/keep.json" for s in ("wanda_sp", "flap", "rcpu", "rcpu-a16")}
    assert "--method rcpu --options '{}' --channel-multiple 16 --channel-rounding floor" in cmds[variant]
    assert all("--channel-" not in c for p, c in cmds.items() if p != variant)
    assert "results/tiny/c8/rcpu-a16-0.5/rcpu/ppl.json" in res.stdout

    targets = [variant, "results/tiny/c8/rcpu-0.5/keep.json"]
    snakemake(tmp_path, "--cores", "1", *targets, "--configfile", str(path))
    keep = artifacts.read_keep(tmp_path / variant)
    d_ff = keep["d_ff"]
    kept = 16 * (int(0.5 * d_ff) // 16)
    assert (keep["channel_multiple"], keep["channel_rounding"]) == (16, "floor")
    assert keep["realised_channel_ratio"] == (d_ff - kept) / d_ff
    assert all(len(k["channels"]) == kept for k in keep["layers"])
    assert "channel_multiple" not in (tmp_path / targets[1]).read_text()

    res = snakemake(tmp_path, "-n", *targets, "--configfile", str(path))
    assert "Nothing to be done" in res.stdout + res.stderr
    cfg["selections"]["rcpu-a16"] = dict(VARIANT, channel_multiple=8)
    res = snakemake(tmp_path, "-n", *targets, "--configfile", str(_write(tmp_path, cfg, "a8.yaml")))
    assert job_counts(res.stdout) == {"select": 1, "total": 1}
    wildcards = re.findall(r"^\s+wildcards: (.*)$", res.stdout, re.M)
    assert len(wildcards) == 1 and "select=rcpu-a16," in wildcards[0], wildcards
