"""Export formats as registered plug-ins (coec.export.formats): the built-in hf and gguf, a
format from a file outside the package through the CLI, and each format's options refused with
any other format."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
from safetensors import safe_open

from coec.export.formats import EXPORT_FORMATS, ExportRequest, export
from coec.export.stage import run_export  # noqa: F401  (registers the built-in formats)
from coec.registry import UnknownName
from conftest import REPO, make_model_dir

PLUGIN = REPO / "tests/plugins/safetensors_format.py"


def coec(*args: str, plugins: str = "") -> subprocess.CompletedProcess:
    env = {**os.environ, "COEC_PLUGINS": plugins} if plugins else dict(os.environ)
    return subprocess.run([sys.executable, "-m", "coec", *args], capture_output=True, text=True, env=env, timeout=600)


def test_builtin_formats_are_registered():
    assert EXPORT_FORMATS.names()[:2] == ("hf", "gguf")
    gguf_options = ["gguf_type", "gguf_fallback", "imatrix", "tokenizer_gguf"]
    assert [o.dest for o in EXPORT_FORMATS["gguf"].options] == gguf_options
    assert EXPORT_FORMATS["hf"].options == ()


def test_unknown_format_and_foreign_option_are_one_line(tmp_path):
    req = ExportRequest("m", None, (), "float32", str(tmp_path / "o"))
    with pytest.raises(UnknownName, match="unknown export format 'onnx'.*available: hf, gguf"):
        export("onnx", req)
    with pytest.raises(ValueError, match="export format 'hf' takes no option gguf_type"):
        export("hf", ExportRequest("m", None, (), "float32", str(tmp_path / "o"), options={"gguf_type": "f16"}))
    res = coec("export", "--model", "m", "--out", str(tmp_path / "o"), "--gguf-type", "f16")
    assert res.returncode == 2 and "--gguf-type need another --format than hf" in res.stderr


def test_a_plugin_format_runs_through_the_cli(tmp_path):
    src = make_model_dir(tmp_path / "tiny", "llama")
    out = tmp_path / "state.safetensors"
    args = [
        "export",
        "--model",
        str(src),
        "--dtype",
        "float32",
        "--format",
        "safetensors-state",
        "--state-dtype",
        "bfloat16",
        "--cell",
        json.dumps({"model": "tiny"}),
        "--out",
        str(out),
    ]
    res = coec(*args)
    assert res.returncode == 2 and "invalid choice: 'safetensors-state'" in res.stderr  # not loaded
    res = coec(*args, plugins=str(PLUGIN))
    assert res.returncode == 0, res.stderr
    model = __import__("transformers").AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32)
    with safe_open(out, "pt") as f:
        assert json.loads(f.metadata()["cell"]) == {"model": "tiny"}
        assert set(f.keys()) == set(model.state_dict())
        w = f.get_tensor("model.layers.0.mlp.down_proj.weight")
    assert w.dtype == torch.bfloat16
    assert torch.equal(w, model.model.layers[0].mlp.down_proj.weight.detach().to(torch.bfloat16))
    res = coec(*args[:-2], "--gguf-type", "f16", "--out", str(tmp_path / "x"), plugins=str(PLUGIN))
    assert res.returncode == 2 and "--gguf-type need another --format than safetensors-state" in res.stderr
