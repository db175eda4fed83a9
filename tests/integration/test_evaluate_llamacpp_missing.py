"""Without llama-cpp-python, a target that runs llama.cpp (the measured Table 4 with a llamacpp-*
runtime) stops before any measurement in one line that says how to install it."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from coec.evaluate.llamacpp import run as llamacpp
from coec.report.measured.table import check_runtimes

INSTALL = "install it with: bash scripts/setup.sh --llamacpp"


def test_check_names_the_runtimes_and_the_install_command(monkeypatch):
    monkeypatch.setattr(llamacpp, "unavailable", lambda: "llama-cpp-python is not importable: ImportError: x")
    with pytest.raises(ValueError, match=r"^table4_measured\.runtimes llamacpp-f16, llamacpp-q8_0 run in llama\.cpp"):
        check_runtimes({"runtimes": ["transformers-fp32", "llamacpp-f16", "llamacpp-q8_0"]})
    check_runtimes({"runtimes": ["transformers-fp32"]})  # transformers alone needs no llama.cpp
    monkeypatch.setattr(llamacpp, "unavailable", lambda: None)
    check_runtimes({"runtimes": ["llamacpp-f16"]})


def test_measured_table_without_bindings_is_one_line(tmp_path):
    hidden = tmp_path / "hide" / "llama_cpp"  # llama_cpp not importable, whatever is installed
    hidden.mkdir(parents=True)
    (hidden / "__init__.py").write_text("raise ImportError(\"No module named 'llama_cpp'\")\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(hidden.parent), os.environ.get("PYTHONPATH", "")])}
    spec = {"runtimes": ["llamacpp-f16"], "cells": [], "prompt_tokens": 4, "new_tokens": 1, "repeats": 1}
    out = tmp_path / "t.csv"
    cmd = [sys.executable, "-m", "coec", "report", "--kind", "table4-measured", "--spec", json.dumps(spec)]
    res = subprocess.run([*cmd, "--out", str(out)], capture_output=True, text=True, env=env, timeout=300)
    errors = [line for line in res.stderr.splitlines() if line.startswith("coec report: error:")]
    assert res.returncode == 2 and len(errors) == 1 and errors[0].endswith(INSTALL), res.stderr[-3000:]
    assert "Traceback" not in res.stderr and not out.exists()
