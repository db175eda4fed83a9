"""``coec compensate`` with a plug-in whose output no module can hold (tests/plugins/bad_output.py)
stops in one line naming the method, the layer, the module and both shapes, and writes no block,
with and without ``reports_errors``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from coec.registry import PLUGINS_ENV

PLUGIN = Path(__file__).resolve().parents[1] / "plugins" / "bad_output.py"


@pytest.mark.parametrize(
    "method, fault, message",
    [
        ("bad_output", "shape", r"returned a weight of shape (32, 32), expected (d_out, |keep|) = (32, 16)"),
        ("bad_output_own", "bias", r"returned a bias of shape (31,), expected (d_out,) = (32,) or None"),
    ],
)
def test_cli_stops_in_one_line_and_writes_no_block(llama_dir, pruned_cell, tmp_path, method, fault, message):
    out = tmp_path / "block0-1.safetensors"
    cmd = [sys.executable, "-m", "coec", "compensate", "--model", str(llama_dir), "--grams", str(pruned_cell / "grams")]
    cmd += ["--keep", str(pruned_cell / "keep.json"), "--spec", json.dumps({"method": method, "fault": fault})]
    cmd += ["--first", "0", "--last", "1", "--device", "cpu", "--out", str(out)]
    env = {**os.environ, PLUGINS_ENV: str(PLUGIN), "COEC_PROGRESS": "0"}
    res = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert res.returncode == 2, res.stderr[-3000:]
    errors = [line for line in res.stderr.splitlines() if line.startswith("coec compensate: error:")]
    assert errors == [f"coec compensate: error: layer 0 o_proj: method '{method}' {message}"], res.stderr[-3000:]
    assert "Traceback" not in res.stderr
    assert not list(tmp_path.iterdir())  # neither the block nor its JSON twin
