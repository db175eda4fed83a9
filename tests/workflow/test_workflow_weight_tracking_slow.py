"""No result outlives the weights it was computed from: a model's weights are part of what its
cells depend on (``provenance.planned_identity`` in every model stage's ``--expect``).

On a finished two-model workflow run: touching a weight file without changing it reruns nothing
(and says so); changing its contents, or re-sharding the checkpoint, re-plans exactly the jobs of
that model (and the table that reads them), none of the other model's; a job whose weights changed
after it was planned stops before any work with one line naming the model and the file.
The same for a hub id without a pinned revision whose cached snapshot moves (a fake local hub
cache, offline)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from conftest import CORPUS, job_counts, make_model_dir, run_env, snakemake

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
COMMIT_A, COMMIT_B = "a" * 40, "b" * 40


def _env(work: Path, **extra) -> dict:
    return {**run_env(), "COEC_DIGEST_CACHE": str(work / "digests"), **extra}


def _snakemake(work: Path, cfg: Path, *args: str, env=None) -> subprocess.CompletedProcess:
    return snakemake(work, "--cores", "2", *args, "--configfile", str(cfg), env=env or _env(work))


def planned_models(output: str) -> dict[str, set]:
    """{rule: models} of the jobs a dry run plans (the model wildcard of each job)."""
    out: dict[str, set] = {}
    for block in output.split("\nrule ")[1:]:
        rule = block.split(":", 1)[0].strip()
        wc = [line for line in block.splitlines() if line.strip().startswith("wildcards:")]
        model = None
        if wc:
            pairs = dict(kv.split("=", 1) for kv in wc[0].split(":", 1)[1].strip().split(", "))
            model = pairs.get("model")
        out.setdefault(rule, set()).add(model)
    return out


#: Table 1's rows of every run here
ROWS = [{"selection": "wanda_sp", "compensation": "none"}, {"selection": "flap", "compensation": "bias"}]


def _config(work: Path, models: dict) -> dict:
    return {
        "models": models,
        "datasets": {"local": {"source": "files", "calib": str(work / "calib.txt"), "eval": str(work / "eval.txt")}},
        "calibration": {"c8": {"dataset": "local", "nsamples": 8, "seqlen": 32, "batch_size": 4}},
        "evaluation": {"ppl_dataset": "local", "ppl_seqlen": 32, "ppl_max_windows": 4, "ppl_batch_size": 2},
        "compensations": {"none": {"method": "none"}, "bias": {"method": "bias"}},
        "compute": {"device": "cpu", "compensate_block": 1, "threads": 1},
        "table1": {"calibration": "c8", "models": list(models), "ratios": [0.5], "rows": ROWS},
    }


#: the two-model run's models: name, folder
TWO = (("tiny", "tiny-llama"), ("b", "tiny-b"))


@pytest.fixture(scope="module")
def two_models(tmp_path_factory):
    """A finished run of two local models (same architecture, different seeds): Table 1 of the rows
    above for both (:func:`_config`, 21 jobs; its own run: this slow file runs in CI's
    whole-workflow step, where no shared run is made)."""
    work = tmp_path_factory.mktemp("weights")
    for seed, (_, folder) in enumerate(TWO):
        make_model_dir(work / folder, "llama", seed=seed)
    (work / "calib.txt").write_text(CORPUS)
    (work / "eval.txt").write_text(CORPUS[1000:4000])
    models = {name: {"source": str(work / folder), "num_layers": 2, "dtype": "float32"} for name, folder in TWO}
    cfg = _config(work, models)
    cfg_path = work / "config.yaml"
    cfg_path.write_text(yaml.safe_dump(cfg))
    _snakemake(work, cfg_path, "results/table1.csv")
    assert (work / "results/b/c8/flap-0.5/bias/ppl.json").is_file()
    return work, cfg_path


#: the jobs of one model's cells of Table 1 (and the table): 2 layers, one compensation job a layer
MODEL_JOBS = {
    "calibrate": 1,
    "gram_check": 1,
    "select": 2,
    "compensate": 2,
    "kl_reference": 1,
    "ppl_dense": 1,
    "ppl_cell": 2,
    "table": 1,
    "total": 11,
}


def _nothing_to_do(res) -> bool:
    return "Nothing to be done" in res.stdout + res.stderr


def _double_a_down_proj(path: Path) -> bytes:
    """Rewrite ``path`` in place with layer 0's down_proj doubled; returns the old bytes."""
    from safetensors.torch import load_file, save_file

    old = path.read_bytes()
    tensors = load_file(path)
    name = next(n for n in tensors if n.endswith("layers.0.mlp.down_proj.weight"))
    tensors[name] = 2 * tensors[name]
    save_file(tensors, path, metadata={"format": "pt"})
    return old


def test_touch_reruns_nothing_and_says_so(two_models):
    work, cfg = two_models
    weights = work / "tiny-llama" / "model.safetensors"
    st = weights.stat()
    os.utime(weights, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    res = _snakemake(work, cfg, "-n", "results/table1.csv")
    assert _nothing_to_do(res), res.stdout[-2000:]
    assert f"{weights}: size or mtime changed since it was hashed; its contents are unchanged" in res.stderr
    res = _snakemake(work, cfg, "-n", "results/table1.csv")  # hashed once: silent now
    assert _nothing_to_do(res) and "size or mtime changed" not in res.stderr


def test_changed_weights_replan_exactly_that_models_jobs(two_models):
    work, cfg = two_models
    weights = work / "tiny-llama" / "model.safetensors"
    old = _double_a_down_proj(weights)
    try:
        res = _snakemake(work, cfg, "-n", "results/table1.csv")
        plan = planned_models(res.stdout)
        assert plan == {
            "calibrate": {"tiny"},
            "gram_check": {"tiny"},
            "select": {"tiny"},
            "compensate": {"tiny"},
            "kl_reference": {"tiny"},
            "ppl_dense": {"tiny"},
            "ppl_cell": {"tiny"},
            "table": {None},
        }, plan
        assert job_counts(res.stdout) == MODEL_JOBS
        assert "contents changed" in res.stderr
        # a job planned for the old weights that starts now stops before any work, naming the file
        from coec.io.provenance import planned_identity

        weights.write_bytes(old)
        planned = planned_identity(str(work / "tiny-llama"))
        _double_a_down_proj(weights)
        expect = {"model": "models.tiny", "num_layers": 2, **planned}
        run = subprocess.run(
            [
                sys.executable,
                "-m",
                "coec",
                "select",
                "--model",
                str(work / "tiny-llama"),
                "--grams",
                str(work / "results/tiny/grams/c8"),
                "--method",
                "flap",
                "--ratio",
                "0.5",
                "--expect",
                json.dumps(expect),
                "--out",
                str(work / "stale-keep.json"),
            ],
            capture_output=True,
            text=True,
            env=_env(work),
        )
        assert run.returncode == 2
        err = [line for line in run.stderr.splitlines() if line.startswith("coec select: error:")]
        assert len(err) == 1 and "models.tiny: the weights in" in err[0]
        assert "(model.safetensors changed)" in err[0] and "re-plan" in err[0]
        assert not (work / "stale-keep.json").exists()
    finally:
        weights.write_bytes(old)  # the same contents again: nothing left to do
    assert _nothing_to_do(_snakemake(work, cfg, "-n", "results/table1.csv"))


def test_resharding_replans_that_model(two_models):
    """A checkpoint re-written as two shards (same tensors, other files) is other weights."""
    from safetensors.torch import load_file, save_file

    work, cfg = two_models
    folder = work / "tiny-b"
    single = folder / "model.safetensors"
    saved = work / "tiny-b.model.safetensors"
    shutil.copy2(single, saved)
    tensors = load_file(single)
    names = sorted(tensors)
    half = len(names) // 2
    shards = {"model-00001-of-00002.safetensors": names[:half], "model-00002-of-00002.safetensors": names[half:]}
    try:
        single.unlink()
        for fname, keys in shards.items():
            save_file({k: tensors[k] for k in keys}, folder / fname, metadata={"format": "pt"})
        index = {"metadata": {}, "weight_map": {k: f for f, ks in shards.items() for k in ks}}
        (folder / "model.safetensors.index.json").write_text(json.dumps(index))
        res = _snakemake(work, cfg, "-n", "results/table1.csv")
        plan = planned_models(res.stdout)
        assert plan.pop("table") == {None} and set().union(*plan.values()) == {"b"}, plan
        assert job_counts(res.stdout) == MODEL_JOBS
    finally:
        for fname in shards:
            (folder / fname).unlink(missing_ok=True)
        (folder / "model.safetensors.index.json").unlink(missing_ok=True)
        shutil.copy2(saved, single)
    assert _nothing_to_do(_snakemake(work, cfg, "-n", "results/table1.csv"))


def test_unpinned_hub_revision_whose_cached_snapshot_moves(tmp_path):
    """A hub id without a pinned revision, from a fake local HF cache (offline): the plan takes
    the commit refs/main points to; moving refs/main to a new snapshot re-plans the model's jobs,
    and a job planned for the old commit stops before any work."""
    from conftest import fake_hub_snapshot

    work = tmp_path
    hub = work / "hub"
    src_a = make_model_dir(work / "src-a", "llama", seed=0)
    src_b = make_model_dir(work / "src-b", "llama", seed=2)
    fake_hub_snapshot(src_a, hub, COMMIT_A)
    repo = hub / "models--org--tiny"
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(COMMIT_A)
    (work / "calib.txt").write_text(CORPUS)
    (work / "eval.txt").write_text(CORPUS[1000:4000])
    cfg = _config(work, {"tiny": {"source": "org/tiny", "num_layers": 2}})
    cfg_path = work / "config.yaml"
    cfg_path.write_text(yaml.safe_dump(cfg))
    env = _env(work, HF_HUB_CACHE=str(hub), HF_HUB_OFFLINE="1")
    target = "results/tiny/c8/wanda_sp-0.5/keep.json"
    _snakemake(work, cfg_path, target, "results/tiny/dense/ppl.json", env=env)
    res = _snakemake(work, cfg_path, "-n", "-p", target, "results/tiny/dense/ppl.json", env=env)
    assert _nothing_to_do(res)
    # the cached main moves to a snapshot with other weights
    snap_b = repo / "snapshots" / COMMIT_B
    snap_b.mkdir(parents=True)
    for f in src_b.iterdir():
        shutil.copy2(f, snap_b / f.name)
    (repo / "refs" / "main").write_text(COMMIT_B)
    res = _snakemake(work, cfg_path, "-n", "-p", target, "results/tiny/dense/ppl.json", env=env)
    assert job_counts(res.stdout) == {"calibrate": 1, "select": 1, "kl_reference": 1, "ppl_dense": 1, "total": 4}
    commands = [line for line in res.stdout.splitlines() if line.startswith("Shell command:")]
    assert len(commands) == 4 and all(COMMIT_B in c and COMMIT_A not in c for c in commands)
    # a job still planned for commit A finds B: one line, nothing written
    expect = json.dumps({"model": "models.tiny", "num_layers": 2, "commit": COMMIT_A})
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "coec",
            "select",
            "--model",
            "org/tiny",
            "--grams",
            str(work / "results/tiny/grams/c8"),
            "--method",
            "flap",
            "--ratio",
            "0.5",
            "--expect",
            expect,
            "--out",
            str(work / "stale.json"),
        ],
        capture_output=True,
        text=True,
        env=env,
    )
    assert run.returncode == 2, run.stderr[-2000:]
    err = [line for line in run.stderr.splitlines() if line.startswith("coec select: error:")]
    assert len(err) == 1 and f"resolves to commit {COMMIT_B}" in err[0] and COMMIT_A in err[0]
    assert not (work / "stale.json").exists()
