"""``coec tiny-model DIR``, the starter of a new method: a tiny model with a working offline
tokenizer, real text, a template plug-in and a config, which the documented command takes to a
Table 1 row of the template method (docs/adding-a-method.md)."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from coec.model.starter import run_command
from coec.registry import PLUGINS_ENV
from conftest import job_counts

REPO = Path(__file__).resolve().parents[2]


def _coec(*args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != PLUGINS_ENV}
    return subprocess.run([sys.executable, "-m", "coec", *args], capture_output=True, text=True, env=env, timeout=300)


def make_starter(work: Path) -> None:
    """``coec tiny-model work --family qwen3``: the folder, its model and tokenizer checked."""
    res = _coec("tiny-model", str(work), "--family", "qwen3")
    assert res.returncode == 0, res.stderr[-3000:]
    assert run_command(work) in res.stdout
    assert {p.name for p in work.iterdir()} == {"model", "calib.txt", "eval.txt", "my_method.py", "config.yaml"}
    from transformers import AutoConfig, AutoTokenizer

    assert AutoConfig.from_pretrained(work / "model").model_type == "qwen3"
    tok = AutoTokenizer.from_pretrained(work / "model")
    line = (work / "eval.txt").read_text().splitlines()[0]
    assert tok.decode(tok(line)["input_ids"]) == line and max(tok(line)["input_ids"]) < 320


def run_starter(work: Path, *extra: str) -> subprocess.CompletedProcess:
    """The starter's documented command (snakemake ... as the folder's config.yaml says), run from
    the repository, without plug-ins from the environment."""
    cmd = shlex.split(run_command(work))
    env = {k: v for k, v in os.environ.items() if k != PLUGINS_ENV}
    return subprocess.run(
        [sys.executable, "-m", *cmd, *extra], cwd=REPO, capture_output=True, text=True, env=env, timeout=900
    )


def test_starter_folder_plans_a_table1_row_of_the_template_method(tmp_path):
    """The documented command plans Table 1 of the starter's rows, the template method's cell with
    its plug-in (the real run: tests/workflow/test_starter_tiny_model_slow.py)."""
    work = tmp_path / "my-method"
    make_starter(work)
    plan = run_starter(work, "-n")
    assert plan.returncode == 0, plan.stderr[-3000:]
    counts = job_counts(plan.stdout)
    assert counts["ppl_cell"] == 3 and counts["compensate"] == 2 and counts["table"] == 1  # COEC and mine
    assert "results/tiny/docs-16x64/wanda_sp-0.5/mine/block0-1.safetensors" in plan.stdout


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
