"""``coec tiny-model DIR``, the starter of a new method: a tiny model with a working offline
tokenizer, real text, a template plug-in and a config, which the documented command takes to a
Table 1 row of the template method (docs/adding-a-method.md)."""

from __future__ import annotations

import csv
import json
import math
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from coec.model.starter import METHOD, run_command
from coec.registry import PLUGINS_ENV

REPO = Path(__file__).resolve().parents[2]


def _coec(*args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != PLUGINS_ENV}
    return subprocess.run([sys.executable, "-m", "coec", *args], capture_output=True, text=True, env=env, timeout=300)


def test_starter_folder_reaches_a_table1_row_of_the_template_method(tmp_path):
    work = tmp_path / "my-method"
    res = _coec("tiny-model", str(work), "--family", "qwen3")
    assert res.returncode == 0, res.stderr[-3000:]
    assert run_command(work) in res.stdout
    assert {p.name for p in work.iterdir()} == {"model", "calib.txt", "eval.txt", "my_method.py", "config.yaml"}
    from transformers import AutoConfig, AutoTokenizer

    assert AutoConfig.from_pretrained(work / "model").model_type == "qwen3"
    tok = AutoTokenizer.from_pretrained(work / "model")
    line = (work / "eval.txt").read_text().splitlines()[0]
    assert tok.decode(tok(line)["input_ids"]) == line and max(tok(line)["input_ids"]) < 320
    cmd = shlex.split(run_command(work))  # snakemake ... as the folder's config.yaml says, from the repository
    env = {k: v for k, v in os.environ.items() if k != PLUGINS_ENV}
    run = subprocess.run([sys.executable, "-m", *cmd], cwd=REPO, capture_output=True, text=True, env=env, timeout=900)
    assert run.returncode == 0, run.stderr[-3000:]
    rows = {r["compensation"]: float(r["tiny"]) for r in csv.DictReader((work / "results/table1.csv").open())}
    assert set(rows) == {"dense", "–", "COEC", "mine"} and all(math.isfinite(v) and v > 1 for v in rows.values())
    info = json.loads(next((work / "results/tiny").glob("*/wanda_sp-0.5/mine/block0-1.json")).read_text())
    assert info["layer1.down_proj"]["method"] == METHOD and "scale_mean" in info["layer1.o_proj"]


@pytest.mark.parametrize(
    "args, needle",
    [
        (["--family", "gpt2"], "coec tiny-model: error: --family: unknown model family 'gpt2'; supported: llama, "),
        ([], "not an empty folder"),
    ],
)
def test_tiny_model_refuses_in_one_line(tmp_path, args, needle):
    (tmp_path / "x").write_text("")
    res = _coec("tiny-model", str(tmp_path), *args)
    errors = [line for line in res.stderr.splitlines() if "error:" in line and line.startswith("coec")]
    assert res.returncode == 2 and len(errors) == 1 and needle in errors[0], res.stderr[-2000:]
    assert "Traceback" not in res.stderr
