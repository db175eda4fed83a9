"""``coec ppl --gguf``: the f32 GGUF export scored in llama.cpp equals ``coec ppl`` of the same
model to 0.1 % (dense and a pruned cell), the record's keys, deliberate breaks that the
comparison detects, and the one-line refusals that write nothing."""

from __future__ import annotations

import json

import pytest

from coec.cli import main
from coec.data import text as data
from coec.evaluate.llamacpp.run import gguf_perplexity, unavailable
from coec.evaluate.ppl import perplexity
from coec.model.cell import build_model

TOL = 1e-3
NEW_KEYS = {"runtime", "gguf_type", "gguf_file", "gguf_sha256", "llama_cpp_python"}


@pytest.fixture(scope="module")
def llama_cpp():
    why = unavailable()
    if why:
        pytest.skip(why)


def text_args(model, text_dataset):
    return ["--model", str(model), "--dataset", json.dumps(text_dataset), "--seqlen", "32", "--max-windows", "4"]


def export_f32(model, out, keep=None):
    args = ["export", "--model", str(model), "--format", "gguf", "--gguf-type", "f32", "--out", str(out)]
    assert main([*args, *(["--keep", str(keep)] if keep else [])]) == 0
    return out


@pytest.mark.parametrize("pruned", [False, True], ids=["dense", "pruned"])
def test_gguf_ppl_equals_ppl(llama_dir, text_dataset, pruned_cell, llama_cpp, tmp_path, pruned):
    keep = pruned_cell / "keep.json" if pruned else None
    gguf_file = export_f32(llama_dir, tmp_path / "export-f32.gguf", keep)
    hf, cpp = tmp_path / "ppl.json", tmp_path / "ppl-gguf-f32.json"
    cell = ["--cell", json.dumps({"ratio": 0.5} if pruned else {})]
    assert (
        main(
            [
                "ppl",
                *text_args(llama_dir, text_dataset),
                *(["--keep", str(keep)] if keep else []),
                *cell,
                "--out",
                str(hf),
            ]
        )
        == 0
    )
    assert main(["ppl", "--gguf", str(gguf_file), *text_args(llama_dir, text_dataset), *cell, "--out", str(cpp)]) == 0
    a, b = json.loads(hf.read_text()), json.loads(cpp.read_text())
    assert set(b) == set(a) | NEW_KEYS
    assert b["runtime"] == "llama.cpp" and b["gguf_type"] == "f32" and len(b["gguf_sha256"]) == 64
    for k in ("tokens_scored", "windows", "seqlen", "model", "dataset", "max_windows", "params", "cell"):
        assert b[k] == a[k], k
    assert abs(b["ppl"] / a["ppl"] - 1) <= TOL, (a["ppl"], b["ppl"])


def test_breaks_move_ppl_beyond_the_tolerance(text_dataset, llama_cpp, tmp_path):
    """Windows shifted by one token, or without their first (BOS) token, change llama.cpp's
    perplexity by more than the parity tolerance: the comparison would see such a slip (a tiny
    model with large weights, so that its predictions depend on the tokens)."""
    from conftest import make_model_dir

    peaked = make_model_dir(tmp_path / "peaked", "llama", initializer_range=1.0)
    gguf_file = export_f32(peaked, tmp_path / "export-f32.gguf")
    model, tok = build_model(str(peaked), "float32", "cpu")
    tokens = data.tokenize_text(tok, data.load_split(text_dataset, "eval"))
    windows = data.eval_windows(tokens, 32, 4)
    ref = perplexity(model, windows, batch_size=4, progress=False)["ppl"]
    assert abs(gguf_perplexity(gguf_file, windows)["ppl"] / ref - 1) <= TOL
    shifted = data.eval_windows(tokens[1:], 32, 4)
    no_bos = windows[:, 1:]
    for broken in (shifted, no_bos):
        assert abs(gguf_perplexity(gguf_file, broken)["ppl"] / ref - 1) > TOL


def test_gguf_of_another_model_is_refused(llama_dir, text_dataset, llama_cpp, tmp_path, tmp_path_factory, capsys):
    from conftest import make_model_dir

    other = make_model_dir(tmp_path_factory.mktemp("other"), "llama", num_hidden_layers=3)
    gguf_file = export_f32(other, tmp_path / "other.gguf")
    out = tmp_path / "ppl-gguf.json"
    assert main(["ppl", "--gguf", str(gguf_file), *text_args(llama_dir, text_dataset), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("coec ppl: error: ") and "is a GGUF of another model" in err
    assert not out.exists()


def test_cell_options_are_refused_with_gguf(llama_dir, text_dataset, tmp_path, capsys):
    out = tmp_path / "x.json"
    args = ["ppl", "--gguf", str(tmp_path / "f.gguf"), *text_args(llama_dir, text_dataset), "--out", str(out)]
    (tmp_path / "block0.safetensors").write_bytes(b"")
    assert main([*args, "--comp", str(tmp_path / "block0.safetensors")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == "coec ppl: error: --comp does not apply with --gguf (the GGUF file is the cell)"
    assert not out.exists()
