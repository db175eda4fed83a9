"""Slow: ``coec ppl --gguf`` of the embedded model's f32 GGUF export equals ``coec ppl`` (the
in-memory model in transformers) to 0.1 %, for the dense model and Table 1's rcpu-0.3/coec cell,
over the first evaluation windows. Needs llama-cpp-python; skipped with the reason otherwise."""

from __future__ import annotations

import json

import pytest

from coec.cli import main
from test_export_gguf_embedded_slow import PPL_WINDOWS, config, dataset, embedded, table1_cell  # noqa: F401

pytestmark = pytest.mark.slow

TOL = 1e-3


@pytest.mark.parametrize("pruned", [False, True], ids=["dense", "rcpu-0.3-coec"])
def test_llama_cpp_ppl_equals_transformers(config, embedded, tmp_path, pruned):  # noqa: F811
    model, text = embedded
    cell = []
    if pruned:
        keep, comp = table1_cell(config, model, text, tmp_path)
        cell = ["--keep", str(keep), "--comp", *map(str, comp)]
    gguf_file = tmp_path / "export-f32.gguf"
    export = ["export", "--model", str(model), *cell, "--format", "gguf", "--gguf-type", "f32"]
    assert main([*export, "--out", str(gguf_file)]) == 0
    ev = config["evaluation"]
    common = ["--model", str(model), "--dataset", json.dumps(dataset(text, config))]
    common += ["--seqlen", str(ev["ppl_seqlen"]), "--max-windows", str(PPL_WINDOWS)]
    hf, cpp = tmp_path / "ppl.json", tmp_path / "ppl-gguf-f32.json"
    assert main(["ppl", *common, *cell, "--dtype", "float32", "--device", "cpu", "--out", str(hf)]) == 0
    assert main(["ppl", "--gguf", str(gguf_file), *common, "--out", str(cpp)]) == 0
    a, b = json.loads(hf.read_text()), json.loads(cpp.read_text())
    assert b["tokens_scored"] == a["tokens_scored"] and b["windows"] == a["windows"] == PPL_WINDOWS
    rel = abs(b["ppl"] / a["ppl"] - 1)
    print(f"{'pruned' if pruned else 'dense'}: transformers {a['ppl']:.6f} llama.cpp {b['ppl']:.6f} rel {rel:.2e}")
    assert rel <= TOL, (a["ppl"], b["ppl"])
