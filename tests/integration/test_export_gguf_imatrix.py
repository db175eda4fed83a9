"""Exports of llama.cpp's quantizer mixes with an importance matrix from the calibration (``coec
imatrix``, ``export --imatrix``): the file names every quantized weight with its row width; the
export loads in llama.cpp, differs from the one without, records the imatrix, and its rounding
error weighted by the statistic is not worse (q4_k_m, and each mix below 4 bits: iq4_xs, q3_k_m,
q3_k_s, q2_k); llama.cpp refuses the mixes that need one without it, none of the offered ones;
refusals write nothing."""

from __future__ import annotations

import json

import gguf
import numpy as np
import pytest
import torch

from coec.cli import main
from coec.evaluate.llamacpp.run import gguf_logits, gguf_perplexity, unavailable
from coec.export.gguf import layout
from coec.export.gguf.writer import PROVENANCE_KEY
from coec.export.imatrix import read_imatrix
from coec.model.cell import build_model


@pytest.fixture(scope="module")
def llama_cpp():
    why = unavailable()
    if why:
        pytest.skip(why)


def cell_args(cell) -> list[str]:
    src, keep, comp = cell
    return ["--model", str(src), "--keep", str(keep), "--comp", *map(str, comp)]


@pytest.fixture(scope="module")
def imatrix_file(kquant_cell, text_dataset, tmp_path_factory):
    out = tmp_path_factory.mktemp("imatrix") / "imatrix.safetensors"
    args = ["--dataset", json.dumps(text_dataset), "--nsamples", "4", "--seqlen", "32", "--seed", "0"]
    assert main(["imatrix", *cell_args(kquant_cell), *args, "--dtype", "float32", "--out", str(out)]) == 0
    return out


@pytest.fixture(scope="module")
def exports(kquant_cell, imatrix_file, llama_cpp, tmp_path_factory):
    """{'f32', 'plain', 'imatrix'}: the cell as f32, as q4_k_m without and with the imatrix."""
    d = tmp_path_factory.mktemp("exports")
    out = {k: d / f"{k}.gguf" for k in ("f32", "plain", "imatrix")}
    base = ["export", *cell_args(kquant_cell), "--format", "gguf"]
    assert main([*base, "--gguf-type", "f32", "--out", str(out["f32"])]) == 0
    assert main([*base, "--gguf-type", "q4_k_m", "--out", str(out["plain"])]) == 0
    assert main([*base, "--gguf-type", "q4_k_m", "--imatrix", str(imatrix_file), "--out", str(out["imatrix"])]) == 0
    return out


def tensors(path) -> dict[str, np.ndarray]:
    """Every 2-D tensor of a GGUF file, dequantized to float32 (rows, row width)."""
    r = gguf.GGUFReader(str(path))
    return {
        t.name: gguf.quants.dequantize(t.data, t.tensor_type).reshape(tuple(int(s) for s in reversed(t.shape)))
        for t in r.tensors
        if len(t.shape) == 2
    }


def weighted_errors(im, ref, plain, weighted) -> tuple[dict[str, float], int]:
    """The rounding error of each file weighted by the importance vectors, summed over the
    weights, and the count of weights whose error the imatrix did not make worse."""
    err = {"plain": 0.0, "imatrix": 0.0}
    better = 0
    for name, imp in im.vectors.items():
        e = {k: float((((q[name] - ref[name]) ** 2) * imp).sum()) for k, q in (("plain", plain), ("imatrix", weighted))}
        err = {k: err[k] + e[k] for k in err}
        better += e["imatrix"] <= e["plain"]
    return err, better


def test_imatrix_file_names_every_quantized_weight(imatrix_file, exports):
    im = read_imatrix(imatrix_file)
    shapes = {n: t.shape for n, t in tensors(exports["f32"]).items()}
    blk = {n for n in shapes if n.startswith("blk.")}
    assert blk <= set(im.vectors) <= set(shapes)
    assert all(im.vectors[n].shape == (shapes[n][1],) for n in im.vectors)
    assert im.tokens == 4 * 32


def test_export_with_imatrix_loads_differs_and_weighs_the_error(kquant_cell, imatrix_file, exports):
    raw = {k: exports[k].read_bytes() for k in ("plain", "imatrix")}
    assert raw["plain"] != raw["imatrix"]
    im = read_imatrix(imatrix_file)
    prov = json.loads(bytes(gguf.GGUFReader(str(exports["imatrix"])).get_field(PROVENANCE_KEY).parts[-1]))
    assert prov["imatrix"] == im.record()
    assert json.loads(exports["imatrix"].with_suffix(".gguf.json").read_text())["imatrix"] == im.record()
    assert "imatrix" not in json.loads(exports["plain"].with_suffix(".gguf.json").read_text())
    err, better = weighted_errors(im, tensors(exports["f32"]), tensors(exports["plain"]), tensors(exports["imatrix"]))
    assert err["imatrix"] < err["plain"]
    assert better >= 0.75 * len(im.vectors)
    src, keep, comp = kquant_cell
    model, _ = build_model(str(src), "float32", "cpu", str(keep), [str(c) for c in comp])
    ids = torch.randint(0, 320, (2, 32), generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        want = model(input_ids=ids).logits.float().numpy()
    got = gguf_logits(exports["imatrix"], ids, n_threads=2)
    rel = float(np.abs(got - want).max()) / float(np.abs(want).max())
    assert rel < 0.35  # the q4_k_m tolerance of test_export_gguf_kquant.py


def test_refusals_write_nothing(kquant_cell, imatrix_file, llama_cpp, tmp_path, capsys, text_dataset):
    base = ["export", *cell_args(kquant_cell), "--format", "gguf"]
    out = tmp_path / "x.gguf"
    assert main([*base, "--gguf-type", "q8_0", "--imatrix", str(imatrix_file), "--out", str(out)]) == 2
    assert "K-quant" in capsys.readouterr().err.strip().splitlines()[-1]
    dense = tmp_path / "dense.safetensors"
    src = str(kquant_cell[0])
    ds = ["--dataset", json.dumps(text_dataset), "--nsamples", "2", "--seqlen", "16", "--dtype", "float32"]
    assert main(["imatrix", "--model", src, *ds, "--out", str(dense)]) == 0
    capsys.readouterr()
    assert main([*base, "--gguf-type", "q4_k_m", "--imatrix", str(dense), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert "the tensor's row width is" in err[-1] and "another cell" in err[-1]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dense.safetensors"]


@pytest.mark.parametrize("gguf_type", ["iq4_xs", "q3_k_m", "q3_k_s", "q2_k"])
def test_the_mixes_below_4_bits_with_imatrix_differ_and_weigh_the_error(
    kquant_cell, imatrix_file, exports, tmp_path, gguf_type
):
    """Each mix below 4 bits, without and with the importance matrix: both load in llama.cpp and
    score a finite perplexity; the imatrix file differs, records the imatrix, has the same tensor
    types here (IQ4_XS gives ffn_down of the first eighth of the blocks Q5_K only without one:
    none of 2 blocks) and a weighted rounding error no worse."""
    base = ["export", *cell_args(kquant_cell), "--format", "gguf", "--gguf-type", gguf_type]
    out = {"plain": tmp_path / "plain.gguf", "imatrix": tmp_path / "imatrix.gguf"}
    assert main([*base, "--out", str(out["plain"])]) == 0
    assert main([*base, "--imatrix", str(imatrix_file), "--out", str(out["imatrix"])]) == 0
    assert out["plain"].read_bytes() != out["imatrix"].read_bytes()
    side = {k: json.loads(v.with_suffix(".gguf.json").read_text()) for k, v in out.items()}
    im = read_imatrix(imatrix_file)
    assert side["imatrix"]["imatrix"] == im.record() and "imatrix" not in side["plain"]
    assert side["imatrix"]["types"] == side["plain"]["types"]
    assert side["imatrix"]["fallbacks"] == side["plain"]["fallbacks"] and side["plain"]["fallback_count"] > 0
    err, better = weighted_errors(im, tensors(exports["f32"]), tensors(out["plain"]), tensors(out["imatrix"]))
    print(f"{gguf_type}: weighted error {err}, {better}/{len(im.vectors)} weights no worse")
    assert err["imatrix"] < err["plain"] and better >= 0.75 * len(im.vectors)
    ids = torch.randint(0, 320, (2, 32), generator=torch.Generator().manual_seed(7))
    for path in out.values():
        ppl = gguf_perplexity(path, ids, n_threads=2)
        assert np.isfinite(ppl["ppl"]) and ppl["ppl"] > 1, ppl


def test_llama_cpp_refuses_only_the_mixes_that_need_an_importance_matrix(exports, tmp_path):
    """Why layout.NEEDS_IMATRIX names none of the offered mixes: llama.cpp's quantizer refuses
    IQ3_XXS and Q2_K_S without an importance matrix (nothing written), and quantizes every
    offered mix without one (the plain exports above)."""
    from coec.io.isolated import call_isolated
    from coec.model.arch.gguf import bindings_quantize

    for ftype in (gguf.LlamaFileType.MOSTLY_IQ3_XXS, gguf.LlamaFileType.MOSTLY_Q2_K_S):
        dst = tmp_path / f"{ftype.name}.gguf"
        rc = call_isolated(bindings_quantize, str(exports["f32"]), str(dst), int(ftype), 1, what="llama.cpp")
        assert rc != 0 and not dst.exists(), ftype.name
    assert layout.NEEDS_IMATRIX == frozenset()
