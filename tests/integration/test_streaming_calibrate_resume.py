"""A calibration job killed with SIGKILL in the middle of its pass resumes at the layer of its
last checkpoint, and the rerun's Gram files are byte-identical to an uninterrupted run's.

The job is the real ``coec calibrate`` command in its own process; a small wrapper kills the
process (``os.kill(getpid(), SIGKILL)``: no cleanup, no Python exit handlers) at a chosen point
of the pass: inside decoder layer 2's forward, or right after the checkpoint before layer 2.
"""

from __future__ import annotations

import hashlib
import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from coec.calibrate.streamed import PROGRESS, partial_dir
from conftest import CORPUS, make_model_dir

KILLER = r"""
import os, signal, sys
from coec.calibrate import streamed as stream_calibrate

where, layer = sys.argv[1], int(sys.argv[2])
if where == "in-layer":   # SIGKILL inside decoder layer `layer`, after its first batch
    run = stream_calibrate.StreamPass.run
    def run_and_die(self, i, lay):
        if i == layer:
            self.hidden[0] = self.hidden[0] * 0  # a half-written generation must not matter
            os.kill(os.getpid(), signal.SIGKILL)
        return run(self, i, lay)
    stream_calibrate.StreamPass.run = run_and_die
else:                     # SIGKILL right after the checkpoint taken before layer `layer`
    ckpt = stream_calibrate._checkpoint
    def ckpt_and_die(work, store, next_layer, key):
        ckpt(work, store, next_layer, key)
        if next_layer == layer:
            os.kill(os.getpid(), signal.SIGKILL)
    stream_calibrate._checkpoint = ckpt_and_die
from coec.cli import main
sys.exit(main(sys.argv[3:]))
"""


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    w = tmp_path_factory.mktemp("resume")
    make_model_dir(w / "model", "llama", num_hidden_layers=4)
    (w / "c.txt").write_text(CORPUS)
    return w


def calibrate_args(work: Path, out: Path, budget: str, seed: int = 0) -> list[str]:
    ds = json.dumps({"source": "files", "calib": str(work / "c.txt"), "eval": str(work / "c.txt")})
    return [
        "calibrate",
        "--model",
        str(work / "model"),
        "--dataset",
        ds,
        "--nsamples",
        "6",
        "--seqlen",
        "24",
        "--batch-size",
        "2",
        "--seed",
        str(seed),
        "--device",
        "cpu",
        "--checkpoint-minutes",
        "0",
        "--hidden-budget-gb",
        budget,
        "--out",
        str(out),
    ]


def digests(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


@pytest.fixture(scope="module")
def reference(work):
    out = work / "reference"
    res = subprocess.run(
        [sys.executable, "-m", "coec", *calibrate_args(work, out, "16")], capture_output=True, text=True, timeout=300
    )
    assert res.returncode == 0, res.stderr[-3000:]
    return digests(out)


@pytest.mark.parametrize("where", ["in-layer", "after-checkpoint"])
@pytest.mark.parametrize("budget", ["16", "1e-12"], ids=["memory", "files"])
def test_killed_calibration_resumes_byte_identical(work, reference, where, budget):
    out = work / f"grams-{where}-{budget}"
    args = calibrate_args(work, out, budget)
    killed = subprocess.run(
        [sys.executable, "-c", KILLER, where, "2", *args], capture_output=True, text=True, timeout=300
    )
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    part = partial_dir(out)
    assert not out.exists() and json.loads((part / PROGRESS).read_text())["next_layer"] == 2
    done = {n: (part / n).stat().st_ino for n in ("layer0.safetensors", "layer1.safetensors")}
    rerun = subprocess.run([sys.executable, "-m", "coec", *args], capture_output=True, text=True, timeout=300)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert "resuming the calibration pass at layer 2" in rerun.stderr
    assert digests(out) == reference
    assert {n: (out / n).stat().st_ino for n in done} == done  # layers 0-1 were not recomputed
    assert not part.exists()


def test_other_inputs_start_afresh(work, reference):
    """A checkpoint of a pass over other inputs (another seed) is not resumed."""
    out = work / "grams-seed"
    killed = subprocess.run(
        [sys.executable, "-c", KILLER, "after-checkpoint", "2", *calibrate_args(work, out, "16", seed=1)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert killed.returncode == -signal.SIGKILL
    rerun = subprocess.run(
        [sys.executable, "-m", "coec", *calibrate_args(work, out, "16")], capture_output=True, text=True, timeout=300
    )
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert "starting afresh" in rerun.stderr and "resuming" not in rerun.stderr
    assert digests(out) == reference
