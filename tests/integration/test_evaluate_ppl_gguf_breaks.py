"""``coec ppl --gguf`` on a pruned, compensated cell with biases: an f32 export of a dense model
and of the cell matches ``coec ppl`` to 0.1 %, and each deliberate break (windows shifted by a
token, a BOS put in front, a compensation bias dropped) moves it beyond that; a file of another
model and missing bindings are refused in one line. Tests that run llama.cpp skip, naming why,
when the bindings cannot be imported."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from coec.cli import main
from coec.data import text as data
from coec.evaluate.llamacpp import ppl as ppl_gguf
from coec.evaluate.llamacpp import run as llamacpp
from conftest import make_model_dir

TOL = 1e-3  # relative perplexity difference llama.cpp (f32 file) vs transformers (fp32)
NEW_KEYS = {"runtime", "gguf_type", "gguf_file", "gguf_sha256", "llama_cpp_python"}
# 2 blocks of 8 query heads (head_dim 8) in 4 KV groups, hidden 64, 96 MLP channels; weights drawn
# wide enough that the model's predictions depend on the context (a shifted window shows)
SHAPE = dict(
    hidden_size=64,
    num_attention_heads=8,
    num_key_value_heads=4,
    head_dim=8,
    intermediate_size=96,
    num_hidden_layers=2,
    initializer_range=0.3,
)
LAYERS = [
    {"kv_groups": [0, 2], "channels": list(range(0, 96, 2))},
    {"kv_groups": [1, 2, 3], "channels": list(range(40))},
]


@pytest.fixture(scope="module")
def llama_cpp():
    why = llamacpp.unavailable()
    if why:
        pytest.skip(why)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """A dense model and a pruned cell of it (keep.json, one compensation file with o_proj /
    down_proj weights and biases), each with its f32 GGUF export."""
    root = tmp_path_factory.mktemp("ppl-gguf")
    src = make_model_dir(root / "src", "llama", **SHAPE)
    keep = root / "keep.json"
    keep.write_text(json.dumps({"layers": LAYERS}))
    g = torch.Generator().manual_seed(3)
    t = {}
    for i, k in enumerate(LAYERS):
        t[f"layer{i}.o_proj.weight"] = torch.randn(64, len(k["kv_groups"]) * 2 * 8, generator=g) * 0.3
        t[f"layer{i}.down_proj.weight"] = torch.randn(64, len(k["channels"]), generator=g) * 0.3
        t[f"layer{i}.o_proj.bias"] = torch.randn(64, generator=g) * 0.5
        t[f"layer{i}.down_proj.bias"] = torch.randn(64, generator=g) * 0.5
    comp = root / "block0-1.safetensors"
    save_file(t, str(comp))
    cell = ["--keep", str(keep), "--comp", str(comp)]
    for name, args in (("dense", []), ("cell", cell)):
        export = ["export", "--model", str(src), *args, "--format", "gguf", "--gguf-type", "f32"]
        assert main([*export, "--out", str(root / f"{name}.gguf")]) == 0
    return root, src, cell, comp


def ppl_args(src: Path, dataset: dict, out: Path) -> list[str]:
    return ["ppl", "--model", str(src), "--dataset", json.dumps(dataset), "--seqlen", "32", "--max-windows", "6"] + [
        "--out",
        str(out),
    ]


def rel(a: dict, b: dict) -> float:
    return abs(a["ppl"] / b["ppl"] - 1)


@pytest.fixture(scope="module")
def scored(models, text_dataset, llama_cpp):
    """(ppl.json, llama.cpp record) of the dense model and of the cell."""
    root, src, cell, _ = models
    out = {}
    for name, args in (("dense", []), ("cell", cell)):
        assert main([*ppl_args(src, text_dataset, root / f"{name}-ppl.json"), *args]) == 0
        gguf = ["--gguf", str(root / f"{name}.gguf"), "--cell", json.dumps({"name": name})]
        assert main([*ppl_args(src, text_dataset, root / f"{name}-gguf.json"), *gguf]) == 0
        out[name] = tuple(json.loads((root / f"{name}-{k}.json").read_text()) for k in ("ppl", "gguf"))
    return out


@pytest.mark.parametrize("name", ["dense", "cell"])
def test_llama_cpp_perplexity_equals_transformers(scored, models, name):
    ref, got = scored[name]
    print(f"{name}: transformers {ref['ppl']:.6f} llama.cpp {got['ppl']:.6f} rel {rel(got, ref):.2e}")
    assert rel(got, ref) <= TOL, (ref["ppl"], got["ppl"])
    assert set(got) == set(ref) | NEW_KEYS
    for k in ("coec_format", "coec_format_version", "tokens_scored", "windows", "seqlen", "max_windows", "dataset"):
        assert got[k] == ref[k], k
    assert got["model"] == ref["model"] and got["cell"] == {"name": name}
    assert got["params"] == ref["params"]  # the file's tensors hold the cell's parameters, no more
    root = models[0]
    assert got["runtime"] == "llama.cpp" and got["gguf_type"] == got["dtype"] == "f32"
    assert got["gguf_file"] == str(root / f"{name}.gguf") and len(got["gguf_sha256"]) == 64
    assert got["llama_cpp_python"]


def shifted(tokens, seqlen, max_windows):
    return _windows(tokens[1:], seqlen, max_windows)


def with_bos(tokens, seqlen, max_windows):
    w = _windows(tokens, seqlen, max_windows)
    return torch.cat([torch.zeros_like(w[:, :1]), w[:, :-1]], dim=1)  # token 0 in front, as a BOS


_windows = data.eval_windows


@pytest.mark.parametrize("name", ["dense", "cell"])
@pytest.mark.parametrize("cut", [shifted, with_bos], ids=["shifted-by-one", "bos-in-front"])
def test_other_windows_break_the_parity(scored, models, text_dataset, tmp_path, monkeypatch, name, cut):
    """The comparison fails when llama.cpp is given other token ids than transformers was."""
    root, src = models[:2]
    ref = scored[name][0]
    monkeypatch.setattr(ppl_gguf.data, "eval_windows", cut)
    assert main([*ppl_args(src, text_dataset, tmp_path / "g.json"), "--gguf", str(root / f"{name}.gguf")]) == 0
    got = json.loads((tmp_path / "g.json").read_text())
    print(f"{name} {cut.__name__}: rel {rel(got, ref):.2e}")
    assert rel(got, ref) > TOL


def test_a_dropped_bias_breaks_the_parity(scored, models, text_dataset, tmp_path):
    """The cell scored by transformers without its compensation biases, against the file with them."""
    root, src, cell, comp = models
    t = {k: v for k, v in load_file(str(comp)).items() if k != "layer1.down_proj.bias"}
    save_file(t, str(tmp_path / "block0-1.safetensors"))
    args = ["--keep", cell[1], "--comp", str(tmp_path / "block0-1.safetensors")]
    assert main([*ppl_args(src, text_dataset, tmp_path / "p.json"), *args]) == 0
    broken = json.loads((tmp_path / "p.json").read_text())
    print(f"bias dropped: rel {rel(scored['cell'][1], broken):.2e}")
    assert rel(scored["cell"][1], broken) > TOL


def one_error(capsys, stage: str = "ppl") -> str:
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith(f"coec {stage}: error:")]
    assert len(err) == 1, err
    return err[0]


def test_a_gguf_of_another_model_is_refused(models, text_dataset, tmp_path, capsys, llama_cpp):
    root = models[0]
    other = make_model_dir(tmp_path / "other", "llama", seed=1, **SHAPE)
    out = tmp_path / "g.json"
    assert main([*ppl_args(other, text_dataset, out), "--gguf", str(root / "dense.gguf")]) == 2
    msg = one_error(capsys)
    assert f"{root / 'dense.gguf'} is a GGUF of another model (weights_sha256" in msg and str(other) in msg
    assert not out.exists() and list(tmp_path.iterdir()) == [tmp_path / "other"]


def test_missing_bindings_are_refused_in_one_line(models, text_dataset, tmp_path, capsys, monkeypatch):
    root, src = models[:2]
    monkeypatch.setattr(llamacpp, "unavailable", lambda: "llama-cpp-python is not importable: ImportError: x")
    out = tmp_path / "g.json"
    assert main([*ppl_args(src, text_dataset, out), "--gguf", str(root / "dense.gguf")]) == 2
    assert one_error(capsys).endswith(f"install it with: {llamacpp.INSTALL}") and not out.exists()
