"""The trimmed workflow through a real SLURM scheduler (scripts/slurm/local_cluster.sh: a one-node
cluster on this machine, as root) with profiles/slurm: every job goes through sbatch, the GPU
rules ask for the (fake) GPU, compensation fans out one job per layer, and table1 equals the
local run's (the session's ``trimmed_reference``) byte for byte. Skipped, with the reason, where
the cluster cannot be brought up (not root, no apt-get). Run with
`pytest -m slow -rs tests/workflow/test_workflow_slurm.py`."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest
import yaml

from conftest import job_counts, snakemake, write_trimmed_workflow

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts/slurm/local_cluster.sh"
pytestmark = pytest.mark.slow

GPU_RULES = {"calibrate", "compensate", "gram_check"}  # the trimmed config gives these gpu: 1
# (gram_check runs with the compensate row's resources)


def cluster_pids(state: Path) -> list[int]:
    return [int(p.read_text()) for p in state.glob("*.pid") if p.read_text().strip()]


@pytest.fixture(scope="module", params=["squeue", "sacct"])
def cluster(request):
    """A running one-node cluster: without accounting (status by squeue), or with slurmdbd +
    MariaDB (status by sacct); yields (status command, environment with SLURM_CONF)."""
    mode = request.param
    if os.geteuid() != 0:
        pytest.skip("SLURM: not root (the local cluster runs slurmctld/slurmd/munged as root)")
    if not (shutil.which("apt-get") or shutil.which("slurmctld")):
        pytest.skip("SLURM: neither apt-get nor an installed slurmctld")
    state = Path(tempfile.mkdtemp(prefix="coec-slurm-"))  # short: the munge socket lives here
    env = dict(os.environ, ACCOUNTING="1" if mode == "sacct" else "0")
    # the job steps find the config through /run/slurm/conf: a link left there by a cluster that
    # was killed instead of stopped must not break this one (it did, before the script replaced it)
    run_conf = Path("/run/slurm/conf")
    stale = mode == "squeue" and not Path("/etc/slurm/slurm.conf").exists() and not os.path.lexists(run_conf)
    if stale:
        run_conf.parent.mkdir(parents=True, exist_ok=True)
        run_conf.symlink_to(Path(tempfile.gettempdir()) / "coec-slurm-killed-long-ago")
    t0 = time.monotonic()
    res = subprocess.run(
        ["bash", str(SCRIPT), "start", str(state)], capture_output=True, text=True, timeout=900, env=env
    )
    up = time.monotonic() - t0
    if res.returncode == 2:  # the script's "cannot run here"
        pytest.skip(f"SLURM ({mode}): {res.stderr.strip().splitlines()[-1]}")
    pids = cluster_pids(state)
    if res.returncode:
        subprocess.run(["bash", str(SCRIPT), "stop", str(state)], timeout=120)
        logs = "".join(f"\n--- {f.name}\n{f.read_text()[-2000:]}" for f in state.glob("*.log"))
        raise AssertionError(f"local cluster did not start:\n{res.stdout}\n{res.stderr}{logs}")
    if stale and os.readlink(run_conf) != str(state):
        subprocess.run(["bash", str(SCRIPT), "stop", str(state)], timeout=120)
        raise AssertionError(f"the stale link /run/slurm/conf -> {os.readlink(run_conf)} was not replaced")
    print(f"\nlocal SLURM cluster ({mode}) up in {up:.1f} s ({res.stdout.strip().splitlines()[-1]})")
    yield mode, dict(os.environ, SLURM_CONF=str(state / "slurm.conf"))
    subprocess.run(["bash", str(SCRIPT), "stop", str(state)], timeout=120, check=True)
    time.sleep(0.5)
    alive = [p for p in pids if Path(f"/proc/{p}").exists()]
    assert not alive, f"daemons still running after stop: {alive}"
    shutil.rmtree(state, ignore_errors=True)


def run_snakemake(workdir: Path, *args: str, env=None) -> tuple[str, float]:
    t0 = time.monotonic()
    res = snakemake(workdir, *args, env=env, timeout=1800)
    return res.stdout + res.stderr, time.monotonic() - t0


def scontrol_job(jobid: str, env) -> dict[str, str]:
    out = subprocess.run(
        ["scontrol", "-o", "show", "job", jobid], capture_output=True, text=True, env=env, check=True
    ).stdout
    return dict(kv.split("=", 1) for kv in out.split() if "=" in kv)


CELL = "results/tiny/c8/wanda_sp-0.5/coec/ppl.json"  # calibrate, select, 2 x compensate, kl_reference, ppl


def test_trimmed_workflow_under_slurm(cluster, trimmed_reference, tmp_path_factory):
    """squeue mode: all of table1 (18 jobs: one gram_check for the cells compensated without a
    check of their own, one dense KL reference); sacct mode: one COEC cell (6 jobs, no gram_check)."""
    mode, env = cluster
    local, t_local, _ = trimmed_reference  # the same config, run locally
    work = tmp_path_factory.mktemp(f"slurm-{mode}")
    _, cfg_path = write_trimmed_workflow(work)
    # the trimmed config asks 3 CPUs per GPU for compensation; the node has fewer: the site
    # settings say what fits (as profiles/slurm/site.yaml does on a real cluster)
    fit = work / "fit.yaml"
    fit.write_text(yaml.safe_dump({"models": {"tiny": {"resources": {"compensate": {"cpus_per_gpu": 1}}}}}))
    target = "results/table1.csv" if mode == "squeue" else CELL
    out, t_slurm = run_snakemake(
        work,
        "--workflow-profile",
        str(REPO / "profiles/slurm"),
        "--slurm-status-command",
        mode,
        "--slurm-init-seconds-before-status-checks",
        "5",
        "--slurm-keep-successful-logs",
        "--latency-wait",
        "5",
        "--configfile",
        str(cfg_path),
        str(SCRIPT.parent / "local_site.yaml"),
        str(fit),
        "--",
        target,
        env=env,
    )
    print(f"trimmed workflow ({target}): local run of table1 {t_local:.0f} s, SLURM ({mode}) {t_slurm:.0f} s")

    stats = job_counts(out)
    n_jobs = 18 if mode == "squeue" else 6  # the dense KL reference included
    submitted = re.findall(r"Job \d+ has been submitted with SLURM jobid (\d+) \(log: (\S+)\)\.", out)
    # every job went through sbatch, each its own SLURM job
    assert len(submitted) == stats["total"] == n_jobs
    assert len({jid for jid, _ in submitted}) == n_jobs
    rules = {}
    for jid, log in submitted:
        rule = re.search(r"/slurm_logs/rule_(\w+)/", log).group(1)
        rules.setdefault(rule, []).append(jid)
        assert Path(log).name == f"{jid}.log" and Path(log).is_file()
        assert f"rule {rule}:" in Path(log).read_text()  # the job step ran the rule
        info = scontrol_job(jid, env)
        assert info["JobState"] == "COMPLETED", (rule, info)
        if rule in GPU_RULES:
            assert info["Partition"] == "gpu" and info.get("TresPerJob") == "gres:gpu:1", (rule, info)
        else:
            assert info["Partition"] == "cpu" and info.get("TresPerJob", "") in ("", "(null)"), (rule, info)
    assert {r: len(j) for r, j in rules.items()} == {r: n for r, n in stats.items() if r != "total"}
    # the status command of the mode sees every job of the run, finished
    run_id = re.search(r"SLURM run ID: (\S+)", out).group(1)
    cmd = (
        ["squeue", "--states=all", "--noheader", "--format=%i|%T", "--name", run_id]
        if mode == "squeue"
        else ["sacct", "-X", "--parsable2", "--noheader", "--format=JobIdRaw,State", "--name", run_id]
    )
    seen = subprocess.run(cmd, capture_output=True, text=True, env=env, check=True).stdout.split()
    assert sorted(seen) == sorted(f"{jid}|COMPLETED" for jid, _ in submitted)
    if mode == "squeue":
        assert len(rules["compensate"]) == 3 * 2  # three compensated cells x two layers
        assert len(rules["gram_check"]) == 1  # one per calibration, read by bias and rcpu
        # the same table as the local run, byte for byte
        assert (work / "results/table1.csv").read_bytes() == (local / "results/table1.csv").read_bytes()
    else:
        assert len(rules["compensate"]) == 2
        # the same perplexity to the last bit (the file also holds paths and timings)
        ppl = [json.loads((d / CELL).read_text()) for d in (work, local)]
        assert (ppl[0]["ppl"], ppl[0]["nll"]) == (ppl[1]["ppl"], ppl[1]["nll"])
