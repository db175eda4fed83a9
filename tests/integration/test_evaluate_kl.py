"""The mean token KL to the dense model in ppl.json (``coec kl-reference``, ``coec ppl
--kl-reference``; docs/kl.md) on the tiny Llama: the dense model's KL to itself is 0 and its
perplexity unchanged to the bit; a pruned cell's KL is positive, equal to the exact KL when the
reference covers the vocabulary, the same streamed or loaded; a reference of windows shifted by
one token, or of another model, is refused in one line before anything is written."""

from __future__ import annotations

import json

import pytest
import torch

from coec.cli import main
from coec.data import text as data
from coec.evaluate.kl import KlMeter, exact_summed_kl, reference_rows, windows_sha256
from coec.evaluate.kl_reference import read_reference, write_reference
from coec.model.cell import build_model

SEQLEN, WINDOWS = 32, 4
VOCAB = 320  # the tiny models' (coec.model.tiny)


def text_args(model, text_dataset):
    return ["--model", str(model), "--dataset", json.dumps(text_dataset), "--seqlen", str(SEQLEN),
            "--max-windows", str(WINDOWS), "--batch-size", "2"]  # fmt: skip


def make_reference(model, text_dataset, out, *extra):
    assert main(["kl-reference", *text_args(model, text_dataset), *extra, "--out", str(out)]) == 0
    return out


def ppl(model, text_dataset, out, *extra):
    assert main(["ppl", *text_args(model, text_dataset), *extra, "--out", str(out)]) == 0
    return json.loads(out.read_text())


@pytest.fixture(scope="module")
def references(llama_dir, text_dataset, tmp_path_factory):
    """The tiny Llama's reference as the workflow makes it (top-64 + 64 samples of the rest), an
    exact one (a top-k over the whole vocabulary) and one with 1024 samples of the rest (the tiny
    random model's distributions are flat: its top 64 of 320 tokens hold about a quarter of the
    probability, so 64 samples of the rest leave a spread of about 12 % over its 124 positions,
    1024 about 1 %; on the embedded model 0.03 %, docs/kl.md)."""
    d = tmp_path_factory.mktemp("klref")
    return {
        "default": make_reference(llama_dir, text_dataset, d / "kl-reference.safetensors"),
        "exact": make_reference(llama_dir, text_dataset, d / "exact.safetensors", "--top-k", str(VOCAB)),
        "sampled": make_reference(llama_dir, text_dataset, d / "sampled.safetensors", "--tail-samples", "1024"),
    }


def test_reference_file(references, llama_dir, text_dataset):
    ref = read_reference(references["default"])
    assert ref.rows.ids.shape == (WINDOWS, SEQLEN - 1, 64) and ref.rows.tail_ids.shape == (WINDOWS, SEQLEN - 1, 64)
    assert ref.meta["vocab"] == VOCAB and ref.meta["seqlen"] == SEQLEN and ref.meta["windows"] == WINDOWS
    assert ref.meta["model"]["weights_sha256"] and ref.meta["dtype"] == "float32"
    exact = read_reference(references["exact"])
    assert exact.rows.top_k == VOCAB and exact.rows.tail_samples == 0
    # deterministic: the same bytes again
    again = make_reference(llama_dir, text_dataset, references["default"].with_name("again.safetensors"))
    assert again.read_bytes() == references["default"].read_bytes()


@pytest.mark.parametrize("which", ["default", "exact", "sampled"])
def test_dense_kl_to_itself_is_zero_and_ppl_unchanged(references, llama_dir, text_dataset, tmp_path, which):
    plain = ppl(llama_dir, text_dataset, tmp_path / "plain.json")
    res = ppl(llama_dir, text_dataset, tmp_path / "ppl.json", "--kl-reference", str(references[which]))
    assert set(res) == set(plain) | {"kl", "kl_reference"}
    assert {k: res[k] for k in plain} == plain  # the perplexity to the bit, every other key too
    assert res["kl"] == 0.0
    ref = res["kl_reference"]
    assert ref["file"] == str(references[which]) and len(ref["sha256"]) == 64 and ref["vocab"] == VOCAB
    assert ref["exact"] == (which == "exact")


def test_pruned_cell_kl(references, llama_dir, text_dataset, pruned_cell, tmp_path):
    keep = ["--keep", str(pruned_cell / "keep.json")]
    exact = ppl(llama_dir, text_dataset, tmp_path / "exact.json", *keep, "--kl-reference", str(references["exact"]))
    sampled = ppl(llama_dir, text_dataset, tmp_path / "ppl.json", *keep, "--kl-reference", str(references["sampled"]))
    loaded = ppl(llama_dir, text_dataset, tmp_path / "loaded.json", *keep, "--kl-reference", str(references["exact"]),
                 "--stream-eval-above-gb", "100")  # fmt: skip
    # the exact KL of the loaded models over the same windows
    dense, tok = build_model(str(llama_dir), "float32", "cpu")
    cell, _ = build_model(str(llama_dir), "float32", "cpu", str(pruned_cell / "keep.json"))
    windows = data.eval_windows(data.tokenize_text(tok, data.load_split(text_dataset, "eval")), SEQLEN, WINDOWS)
    with torch.no_grad():
        truth = float(exact_summed_kl(dense(windows).logits, cell(windows).logits)) / (WINDOWS * (SEQLEN - 1))
    assert truth > 1e-4  # a random tiny model: flat distributions, small but clearly non-zero
    assert exact["kl"] == pytest.approx(truth, rel=1e-6) and loaded["kl"] == pytest.approx(truth, rel=1e-6)
    assert sampled["kl"] == pytest.approx(truth, rel=0.05)  # top 64 of 320 tokens, 1024 samples of the rest


def test_reference_of_windows_shifted_by_one_token(references, llama_dir, text_dataset, tmp_path, capsys):
    """A reference made on the windows one token later: its KL to the dense model would be far
    from 0, and the digest check refuses it before any scoring, in one line, writing nothing."""
    dense, tok = build_model(str(llama_dir), "float32", "cpu")
    tokens = data.tokenize_text(tok, data.load_split(text_dataset, "eval"))
    windows = data.eval_windows(tokens, SEQLEN, WINDOWS)
    shifted = data.eval_windows(tokens[1:], SEQLEN, WINDOWS)
    with torch.no_grad():
        rows = reference_rows(dense(shifted).logits, VOCAB, 0)
        meter = KlMeter(rows)
        meter(0, windows, dense(windows).logits)
    assert meter.mean() > 0.01  # unchecked, the shift would read as a clearly non-zero KL
    ref = read_reference(references["exact"])
    bad = tmp_path / "shifted.safetensors"
    write_reference(bad, rows, dict(ref.meta, windows_sha256=windows_sha256(shifted)))
    out = tmp_path / "ppl.json"
    assert main(["ppl", *text_args(llama_dir, text_dataset), "--kl-reference", str(bad), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith(f"coec ppl: error: {bad}: made on other token windows") and not out.exists()
    # and another window length (the workflow's evaluation changed, the reference not remade)
    args = [a if a != str(SEQLEN) else "16" for a in text_args(llama_dir, text_dataset)]
    refused = main(["ppl", *args, "--kl-reference", str(references["exact"]), "--out", str(out)])
    assert refused == 2 and "made on other token windows" in capsys.readouterr().err and not out.exists()


def test_reference_of_another_model_is_refused(references, text_dataset, tmp_path, capsys):
    from conftest import make_model_dir

    other = make_model_dir(tmp_path / "other", "llama", seed=1)  # same tokenizer and windows
    out = tmp_path / "ppl.json"
    args = ["ppl", *text_args(other, text_dataset), "--kl-reference", str(references["exact"]), "--out", str(out)]
    assert main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("coec ppl: error: ") and "is the KL reference of another model (weights_sha256" in err
    assert not out.exists()
