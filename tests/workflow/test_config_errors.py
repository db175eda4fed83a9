"""A bad config stops ``snakemake`` with its one line and exit status 1: no traceback frames
after it (Snakemake prints frames for an exception raised while it reads the Snakefile); the
``coec`` CLI's errors are one line too."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
import yaml

from coec.registry import PLUGINS_ENV
from conftest import make_model_dir, snakemake, write_trimmed_workflow


def _bad_method(cfg):
    cfg["compensations"]["coec"]["method"] = "coecc"


def _bad_key(cfg):
    cfg["evaluation"]["ppl_seqln"] = 32


def _bad_plugin(cfg):
    cfg["plugins"] = ["no_such_plugin.py"]


def _bad_reference(cfg):
    cfg["table1"]["calibration"] = "c16"


def _bad_search(cfg):
    cfg["selections"] = {"search-x": {"score": "search", "candidates": "nope", "compensation": "coec", "holdout": "c8"}}


CASES = {
    "method": (
        _bad_method,
        "config: bad value at compensations.coec.method: unknown compensation method 'coecc'; "
        "did you mean 'coec'? (available: none, bias, lstsq, rcpu, coec, blend)",
    ),
    "key": (_bad_key, "config: unknown key under evaluation: Additional properties are not allowed"),
    "plugin": (_bad_plugin, "config: plugins[0]: plug-in 'no_such_plugin.py' could not be loaded: FileNotFoundError"),
    "reference": (_bad_reference, "config: table1.calibration names unknown calibration entry 'c16' (known: c8,"),
    "search": (_bad_search, "config: selections.search-x.candidates: selection 'nope' is not registered"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_snakemake_prints_a_config_error_as_one_line(tmp_path, case):
    edit, line = CASES[case]
    cfg, path = write_trimmed_workflow(tmp_path)
    edit(cfg)
    path.write_text(yaml.safe_dump(cfg))
    res = snakemake(tmp_path, "-n", "results/table1.csv", "--configfile", str(path), check=False)
    assert res.returncode == 1
    out = res.stdout + res.stderr
    assert not re.search(r'File "|line \d+|Traceback|ConfigError', out), out
    errors = [x for x in res.stderr.splitlines() if x.startswith("config:")]
    assert len(errors) == 1 and errors[0].startswith(line), res.stderr


def test_the_cli_prints_a_bad_name_as_one_line(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != PLUGINS_ENV}
    model = make_model_dir(tmp_path / "model", "llama")
    cmd = [sys.executable, "-m", "coec", "select", "--model", str(model), "--grams", str(tmp_path)]
    res = subprocess.run(
        [*cmd, "--method", "wanda", "--ratio", "0.5", "--out", str(tmp_path / "keep.json")],
        capture_output=True,
        text=True,
        env=env,
    )
    assert res.returncode == 2 and not re.search(r'File "|Traceback', res.stderr)
    assert res.stderr.splitlines()[-1] == (
        "coec select: error: --options.score: unknown selection score 'wanda'; did you mean 'wanda_sp'? "
        "(available: wanda_sp, flap, rcpu, obs)"
    )
