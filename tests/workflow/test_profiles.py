"""Workflow profiles: profiles/default applies to a plain `snakemake` run of the root Snakefile;
profiles/slurm takes its site settings (account, partitions, GPU model) from one config file."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from conftest import snakemake

REPO = Path(__file__).resolve().parents[2]


def _plain(cwd: Path, *args: str) -> str:
    """A plain ``snakemake`` (no --snakefile / --directory unless ``args`` give them) run in ``cwd``."""
    res = snakemake(None, *args, cwd=cwd, timeout=300)
    return res.stdout + res.stderr


#: a target of the default config with a small DAG (the converted model and text, one evaluation)
DENSE_PPL = "results/smollm2-135m/dense/ppl.json"


def test_default_profile_applies_to_a_plain_run(tmp_path):
    """`snakemake -n <target>` in the repository (no --workflow-profile) uses profiles/default:
    its `printshellcmds: true` prints the jobs' shell commands."""
    out = _plain(REPO, "-n", "--directory", str(tmp_path), DENSE_PPL)
    assert "workflow specific profile profiles/default " in out
    assert "Shell command: OMP_NUM_THREADS=" in out
    # the same run without the profile prints no shell command
    out = _plain(REPO, "-n", "--workflow-profile", "none", "--directory", str(tmp_path), DENSE_PPL)
    assert "workflow specific profile" not in out and "Shell command:" not in out
    # from elsewhere, found next to the Snakefile
    out = _plain(tmp_path, "-n", "--snakefile", str(REPO / "Snakefile"), DENSE_PPL)
    assert f"workflow specific profile {REPO / 'profiles/default'}" in out
    assert "Shell command: OMP_NUM_THREADS=" in out


def test_profiles_found_by_old_paths():
    for name in ("default", "slurm"):
        assert (REPO / "workflow/profiles" / name / "config.yaml").resolve() == (
            REPO / "profiles" / name / "config.yaml"
        ).resolve()


def planned(out: str) -> list[tuple[str, dict]]:
    jobs = []
    for block in out.split("\nrule ")[1:]:
        m = re.search(r"^\s+resources: (.*)$", block, re.M)
        jobs.append(
            (block.split(":", 1)[0].strip(), dict(kv.split("=", 1) for kv in m.group(1).split(", ")) if m else {})
        )
    return jobs


def test_slurm_profile_site_settings(tmp_path):
    """The SLURM profile sets no partition/account (nothing to replace); a site file given
    after the workflow config sets account, partitions and GPU model, key by key."""
    prof = yaml.safe_load((REPO / "profiles/slurm/config.yaml").read_text())
    assert prof["slurm-status-command"] == "squeue"
    assert not {"slurm_partition", "slurm_account", "gpu_model"} & set(prof["default-resources"])
    site = yaml.safe_load((REPO / "profiles/slurm/site.yaml").read_text())
    assert set(site["resources"]["default"]) >= {"slurm_account", "slurm_partition", "gpu_model"}
    mine = tmp_path / "site.yaml"
    mine.write_text(
        yaml.safe_dump(
            {
                "resources": {
                    "default": {"slurm_account": "proj1", "slurm_partition": "cpu", "gpu_model": "a100"},
                    "calibrate": {"slurm_partition": "gpu"},
                    "compensate": {"slurm_partition": "gpu"},
                    "ppl": {"slurm_partition": "gpu"},
                    "zeroshot": {"slurm_partition": "gpu"},
                },
                # a smaller DAG: two models, one compensated row
                "table1": {
                    "models": ["llama-3.1-8b", "llama-3-70b"],
                    "rows": [{"selection": "rcpu", "compensation": "rcpu"}],
                },
            }
        )
    )
    out = _plain(
        tmp_path,
        "-n",
        "--snakefile",
        str(REPO / "Snakefile"),
        "--workflow-profile",
        str(REPO / "profiles/slurm"),
        "--configfile",
        str(REPO / "workflow/configs/paper.yaml"),
        str(REPO / "profiles/slurm/site.yaml"),
        str(mine),
        "--",
        "results/table1.csv",
    )
    jobs = planned(out)
    by_rule = {}
    for rule, res in jobs:
        by_rule.setdefault(rule, []).append(res)
    assert {"calibrate", "select", "compensate", "ppl_cell"} <= set(by_rule)
    for rule, res in jobs:
        assert res["slurm_account"] == "proj1", rule
        gpu = int(res["gpu"]) > 0
        assert res["slurm_partition"] == ("gpu" if gpu else "cpu"), (rule, res)
        assert res.get("gpu_model", "") == ("a100" if gpu else ""), (rule, res)  # CPU jobs: none
        # the paper's model settings (gpu, mem_mb, runtime: the streamed path's plan) survive the site file
    paper = yaml.safe_load((REPO / "workflow/configs/paper.yaml").read_text())["models"]
    want = {str(paper[m]["resources"]["compensate"]["mem_mb"]) for m in ("llama-3.1-8b", "llama-3-70b")}
    assert {r["mem_mb"] for r in by_rule["compensate"]} == want and len(want) == 2
    assert {r["cpus_per_gpu"] for r in by_rule["compensate"]} == {"4"}
    assert {r["gpu"] for r in by_rule["ppl_cell"]} == {"1"}  # one GPU: the 70B streams too
