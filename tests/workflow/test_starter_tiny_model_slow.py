"""The slow test of test_starter_tiny_model.py: the starter folder's documented command run to
Table 1 (a Snakemake run of the whole chain, 10 jobs); set slow for the whole file (CI's slow
steps, or `pytest -m slow`)."""

from __future__ import annotations

import csv
import json
import math

import pytest

from coec.model.starter import METHOD
from test_starter_tiny_model import make_starter, run_starter

pytestmark = pytest.mark.slow


def test_starter_folder_reaches_a_table1_row_of_the_template_method(tmp_path):
    work = tmp_path / "my-method"
    make_starter(work)
    run = run_starter(work)
    assert run.returncode == 0, run.stderr[-3000:]
    rows = {r["compensation"]: float(r["tiny"]) for r in csv.DictReader((work / "results/table1.csv").open())}
    assert set(rows) == {"dense", "–", "COEC", "mine"} and all(math.isfinite(v) and v > 1 for v in rows.values())
    info = json.loads(next((work / "results/tiny").glob("*/wanda_sp-0.5/mine/block0-1.json")).read_text())
    assert info["layer1.down_proj"]["method"] == METHOD and "scale_mean" in info["layer1.o_proj"]
