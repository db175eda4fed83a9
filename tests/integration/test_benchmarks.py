"""The benchmark scripts that ``benchmarks/gpu_check.sh`` runs on a GPU still run (here on the CPU,
at tiny sizes), and every script, flag and test file the GPU check names exists.

A GPU run is rare and short; a script that broke since the last one would waste it. These tests
run each script as the GPU check does, as a subprocess from the repository root, with sizes that
take seconds.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "benchmarks"
GPU_CHECK = BENCH / "gpu_check.sh"


def run_script(args: list[str], timeout: int = 300) -> str:
    """Run ``python benchmarks/<script> args`` from the repository root; return its stdout."""
    proc = subprocess.run(
        [sys.executable, *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert proc.returncode == 0, f"{args} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc.stdout


def gpu_check_commands() -> list[list[str]]:
    """The check's command lines (continuations joined), split like the shell would."""
    text = GPU_CHECK.read_text().replace("\\\n", " ")
    cmds = []
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("#") or "$py" not in line:
            continue
        cmd = line[line.index("$py") :].split("|")[0]
        cmds.append([t for t in shlex.split(cmd.replace('"$OUT', '"OUT')) if ">" not in t])  # no redirections
    return cmds


def test_gpu_check_names_existing_scripts_flags_and_tests():
    cmds = gpu_check_commands()
    scripts = [c[1] for c in cmds if c[1].startswith("benchmarks/")]
    assert len(scripts) >= 8, scripts
    for cmd in cmds:
        if cmd[1] == "-m":  # $py -m pytest ... tests/...
            files = [t for t in cmd if t.startswith("tests/")]
            assert files and all((ROOT / f).is_file() for f in files), files
            continue
        if cmd[1] == "-c":
            continue
        script = ROOT / cmd[1]
        assert script.is_file(), script
        source = script.read_text()
        if "device_args" in source:  # the shared --device/--dtype/--repeat options
            source += (BENCH / "gram_blocks.py").read_text()
        for flag in (t.split("=")[0] for t in cmd[2:] if t.startswith("--")):
            assert re.search(rf"add_argument\(\s*\"{re.escape(flag)}\"", source), f"{cmd[1]} has no {flag}"


def test_gpu_check_test_selection_collects_the_cuda_tests():
    cmd = next(c for c in gpu_check_commands() if c[1] == "-m")
    args = [a for a in cmd[3:] if a not in ("-q",)]
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout[-2000:]
    collected = [ln for ln in proc.stdout.splitlines() if "::" in ln]
    assert any("cuda" in ln for ln in collected) and any("gram_product" in ln for ln in collected), collected
    assert len(collected) >= 8, collected


def test_bench_compensate_every_method_width_scaling_and_json(tmp_path):
    out = tmp_path / "w.json"
    text = run_script(
        [
            "benchmarks/bench_compensate.py",
            "--widths",
            "64,96",
            "--max-rounds",
            "1",
            "--test-tokens",
            "256",
            "--json",
            str(out),
        ]
    )
    assert "log-log" in text or "slope" in text
    rows = json.loads(out.read_text())["rows"]
    assert {r["method"] for r in rows} == {"none", "bias", "lstsq", "rcpu", "coec"}
    assert {r["shape"] for r in rows} == {"w64.o_proj", "w64.down_proj", "w96.o_proj", "w96.down_proj"}
    for r in rows:
        assert r["relerr_after"] <= r["relerr_before"] + 1e-9 or r["method"] == "none"
        assert r["heldout"] is not None
    layers = json.loads(out.read_text())["layers"]  # per layer: o_proj + down_proj of one width
    assert {(t["set"], t["method"]) for t in layers} == {
        (w, m) for w in ("w64", "w96") for m in ("none", "bias", "lstsq", "rcpu", "coec")
    }
    for t in layers:
        mods = [r for r in rows if r["shape"].startswith(t["set"] + ".") and r["method"] == t["method"]]
        assert t["seconds"] == pytest.approx(sum(r["seconds"] for r in mods))
        assert (t.get("coec_s") is not None) == (t["method"] == "coec")
        if t["method"] == "coec":
            assert 0 < t["coec_s"] <= t["seconds"]
    assert "| layer (o_proj + down_proj) |" in text


def test_bench_compensate_breakdown_projection_and_options(tmp_path):
    """The GPU check's breakdown / --coec-opts / projection path, on the embedded o_proj shape."""
    out = tmp_path / "b.json"
    text = run_script(
        [
            "benchmarks/bench_compensate.py",
            "--shapes",
            "embedded",
            "--modules",
            "o_proj",
            "--methods",
            "coec",
            "--max-rounds",
            "1",
            "--test-tokens",
            "0",
            "--breakdown",
            "--coec-opts",
            '{"left_polar": "eigh", "cayley_inverse": "solve"}',
            "--json",
            str(out),
        ]
    )
    assert "Projection:" in text and "8b.down_proj" in text and "70b.down_proj" in text
    (row,) = json.loads(out.read_text())["rows"]
    names = {b["name"] for b in row["breakdown"]}
    assert {"coec.setup.temper", "coec.setup.align", "coec.right", "coec.left", "coec.align.value"} <= names
    assert row["rounds"] == 1


def test_rg_update_script():
    """The carried R Gxx benchmark: the product, the product at a second thread count, carry with no
    refresh and with each refresh; only the refreshing run refreshes, every q error is float32-sized."""
    text = run_script(
        [
            "benchmarks/rg_update.py",
            "--widths",
            "64",
            "--no-embedded",
            "--max-rounds",
            "3",
            "--tokens",
            "1000",
            "--test-tokens",
            "256",
            "--refresh",
            "2",
        ]
    )
    rows = [[c.strip() for c in ln.strip("|").split("|")] for ln in text.splitlines() if ln.startswith("| w64")]
    assert [r[1] for r in rows] == ["product", "product, 1 thread(s)", "carry, no refresh", "carry, refresh 2"]
    assert [int(r[9]) for r in rows][:3] == [0, 0, 0] and int(rows[3][9]) == int(rows[3][7]) // 2 > 0
    assert all(float(r[11]) < 1e-5 and float(r[3]) > 0 for r in rows)


def test_left_polar_script():
    text = run_script(["benchmarks/left_polar.py", "--shapes", "embedded", "--max-rounds", "1", "--time", "1"])
    assert "svd" in text and "eigh" in text and "cond(A^T A)" in text


def test_watchdog_overhead_script():
    text = run_script(["benchmarks/watchdog_overhead.py", "--sizes", "16,32", "--repeat", "1"])
    rows = [ln.split() for ln in text.splitlines() if ln.startswith(("svd ", "eigh "))]
    assert len(rows) == 4 and all(float(r[-1]) > 0 for r in rows)


def test_gram_blocks_script():
    text = run_script(
        ["benchmarks/gram_blocks.py", "--dims", "64,96", "--tokens", "128", "--blocks", "16,32", "--repeat", "1"]
    )
    assert re.search(r"^\| 96 \|", text, re.M), text


def test_bench_foundation_script(llama_dir):
    text = run_script(
        [
            "benchmarks/bench_foundation.py",
            "--model",
            str(llama_dir),
            "--nseq",
            "2",
            "--seqlen",
            "16",
            "--batch",
            "1",
            "--repeat",
            "1",
        ]
    )
    for line in ("plain decoder forward", "calibration (layer-wise)", "FLOP bound", "perplexity"):
        assert line in text, text
    assert re.search(r"calibration ratio \d+\.\d+ \(goal <= 1\.25\)", text)


@pytest.mark.parametrize("arch", ["Llama-3.1-8B", "Qwen2.5-7B"])
def test_random_arch_model_builds_with_the_published_shape(arch):
    """``bench_foundation --random-arch`` (the GPU check's calibration step), built on meta tensors."""
    sys.path.insert(0, str(BENCH))
    try:
        from bench_foundation import random_model
    finally:
        sys.path.remove(str(BENCH))
    from coec.report.cost import PUBLISHED_ARCHS

    model = random_model(arch, 2, "bfloat16", torch.device("meta"))
    spec = PUBLISHED_ARCHS[arch]
    cfg = model.config
    assert cfg.num_hidden_layers == 2 and len(model.model.layers) == 2
    mlp = model.model.layers[0].mlp
    assert mlp.down_proj.weight.shape == (spec["hidden_size"], spec["intermediate_size"])
    assert model.model.layers[0].self_attn.o_proj.weight.dtype == torch.bfloat16


def test_kl_reference_script():
    """benchmarks/kl_reference.py on the tiny model: the top-k over the whole vocabulary gives the
    exact KL, the float16 logits too (docs/kl.md)."""
    text = run_script(["benchmarks/kl_reference.py", "--repeat", "1", "--skip-extrapolation"])
    exact = re.search(r"exact KL ([0-9.]+)", text).group(1)
    assert re.search(rf"^  full-fp16 .* KL {exact}$", text, re.M), text
    assert re.search(rf"^  top-320\+0 .* KL {exact} \(", text, re.M), text
