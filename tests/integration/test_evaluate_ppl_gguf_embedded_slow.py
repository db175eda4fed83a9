"""Slow: ``coec ppl --gguf`` of the embedded model's f32 GGUF export equals ``coec ppl`` (the
in-memory model in transformers) to 0.1 %, for the dense model and Table 1's rcpu-0.3/coec cell,
over the first evaluation windows. The cell (tests/embedded_cells.py) is built once per pytest worker and
shared with test_export_gguf_embedded_slow.py. Needs llama-cpp-python; skipped with the reason otherwise."""

from __future__ import annotations

import json

import pytest

from coec.cli import main
from embedded_cells import PPL_WINDOWS, dataset, repo_config

pytestmark = pytest.mark.slow

TOL = 1e-3


@pytest.mark.parametrize("pruned", [False, True], ids=["dense", "rcpu-0.3-coec"])
def test_llama_cpp_ppl_equals_transformers(embedded, embedded_cell, tmp_path, pruned):
    config = repo_config()
    model, text = embedded
    cell = []
    if pruned:
        keep, comp = embedded_cell("table1")
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
