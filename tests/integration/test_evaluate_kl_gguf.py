"""``coec ppl --gguf --kl-reference``: a GGUF scored in llama.cpp against the transformers dense
model's reference (docs/kl.md): the f32 export of the dense model has a KL of 0 to rounding, that
of a pruned cell the cell's KL in transformers; a GGUF of another model, or a reference of another
model, is refused in one line with nothing written."""

from __future__ import annotations

import json

import pytest

from coec.cli import main
from test_evaluate_ppl_gguf import NEW_KEYS, export_f32, llama_cpp, text_args  # the GGUF perplexity tests' helpers

__all__ = ["llama_cpp"]  # a fixture of this module too

VOCAB = 320


@pytest.fixture(scope="module")
def reference(llama_dir, text_dataset, tmp_path_factory):
    out = tmp_path_factory.mktemp("klref") / "kl-reference.safetensors"
    assert main(["kl-reference", *text_args(llama_dir, text_dataset), "--top-k", str(VOCAB), "--out", str(out)]) == 0
    return out


@pytest.mark.parametrize("pruned", [False, True], ids=["dense", "pruned"])
def test_gguf_kl_equals_the_transformers_kl(
    llama_dir, text_dataset, pruned_cell, reference, llama_cpp, tmp_path, pruned
):
    keep = ["--keep", str(pruned_cell / "keep.json")] if pruned else []
    gguf_file = export_f32(llama_dir, tmp_path / "export-f32.gguf", pruned_cell / "keep.json" if pruned else None)
    hf, cpp = tmp_path / "ppl.json", tmp_path / "ppl-gguf-f32.json"
    kl = ["--kl-reference", str(reference)]
    assert main(["ppl", *text_args(llama_dir, text_dataset), *keep, *kl, "--out", str(hf)]) == 0
    assert main(["ppl", "--gguf", str(gguf_file), *text_args(llama_dir, text_dataset), *kl, "--out", str(cpp)]) == 0
    a, b = json.loads(hf.read_text()), json.loads(cpp.read_text())
    assert set(b) == set(a) | NEW_KEYS and {"kl", "kl_reference"} <= set(a)
    assert b["kl_reference"] == a["kl_reference"]
    if pruned:
        assert a["kl"] > 1e-4 and b["kl"] == pytest.approx(a["kl"], rel=1e-2)
    else:
        assert a["kl"] == 0.0 and abs(b["kl"]) < 1e-6  # llama.cpp's f32 forward, rounding only


def test_kl_of_a_gguf_of_another_model_is_refused(llama_dir, text_dataset, reference, llama_cpp, tmp_path, capsys):
    from conftest import make_model_dir

    other = make_model_dir(tmp_path / "other", "llama", num_hidden_layers=3)
    gguf_file = export_f32(other, tmp_path / "other.gguf")
    out = tmp_path / "ppl-gguf.json"
    args = ["ppl", "--gguf", str(gguf_file), *text_args(llama_dir, text_dataset), "--kl-reference", str(reference)]
    assert main([*args, "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("coec ppl: error: ") and "is a GGUF of another model" in err
    assert not out.exists()


def test_kl_reference_of_another_model_is_refused(llama_dir, text_dataset, llama_cpp, tmp_path, capsys):
    """The GGUF is the model's, the reference another model's (same tokenizer and windows)."""
    from conftest import make_model_dir

    other = make_model_dir(tmp_path / "other", "llama", seed=1)
    ref = tmp_path / "other-ref.safetensors"
    assert main(["kl-reference", *text_args(other, text_dataset), "--out", str(ref)]) == 0
    gguf_file = export_f32(llama_dir, tmp_path / "export-f32.gguf")
    out = tmp_path / "ppl-gguf.json"
    args = ["ppl", "--gguf", str(gguf_file), *text_args(llama_dir, text_dataset), "--kl-reference", str(ref)]
    assert main([*args, "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith(f"coec ppl: error: {ref}: is the KL reference of another model") and not out.exists()
