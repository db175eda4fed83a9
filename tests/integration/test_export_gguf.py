"""GGUF export: a pruned, compensated cell written as one GGUF file that a real llama.cpp
(llama-cpp-python) loads and runs with the in-memory model's logits and perplexity; llama arch
for one width in every block, deci for per-layer widths; per-tensor q8_0 fallbacks; refusals.

Tests that run llama.cpp skip, naming why, when ``llama_cpp`` cannot be imported
(``pip install llama-cpp-python==0.3.36``, a source build of llama.cpp)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch

from coec.cli import build_parser, main
from coec.data import text as data
from coec.evaluate.llamacpp.run import gguf_logits, gguf_perplexity, unavailable
from coec.evaluate.ppl import perplexity
from coec.export.gguf import GGUF_TYPES, GgufOptions, permute_qk, tensor_type, write_gguf
from coec.export.gguf.layout import KQUANTS, rope_freq_factors
from coec.model.cell import build_model
from conftest import CORPUS, make_model_dir

# 3 blocks of 8 query heads (head_dim 8) in 4 KV groups, hidden 64, 96 MLP channels
SHAPE = dict(
    hidden_size=64,
    num_attention_heads=8,
    num_key_value_heads=4,
    head_dim=8,
    initializer_range=0.1,
    intermediate_size=96,
    num_hidden_layers=3,
)
LLAMA3_ROPE = {
    "rope_type": "llama3",
    "rope_theta": 500000.0,
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 32,
}
# uniform: 6 of 8 heads (hidden 64 != 6 x 8: an explicit head size; o_proj rows of 48 values
# cannot take q8_0), 32 channels
UNIFORM = [{"kv_groups": [0, 1, 3], "channels": list(range(0, 96, 3))}] * 3
# per-layer widths as FLAP's AL-AM structure leaves them: 4/6/2 heads, 40/64/96 channels
PER_LAYER = [
    {"kv_groups": [0, 2], "channels": list(range(40))},
    {"kv_groups": [1, 2, 3], "channels": list(range(0, 96, 3)) + list(range(1, 96, 3))},
    {"kv_groups": [3], "channels": list(range(96))},
]
STRUCTURES = {"uniform": UNIFORM, "per-layer": PER_LAYER}


@pytest.fixture(scope="module")
def llama_cpp():
    why = unavailable()
    if why:
        pytest.skip(why)


def make_cell(root: Path, family: str, layers: list[dict], bias: bool, **over):
    """A tiny model folder, keep.json and one compensation block file: random compensated
    o_proj / down_proj weights and, with ``bias``, FLAP-style o_proj and down_proj biases."""
    from safetensors.torch import save_file

    src = make_model_dir(root / "src", family, **{**SHAPE, **over})
    keep = root / "keep.json"
    keep.write_text(json.dumps({"layers": layers}))
    g = torch.Generator().manual_seed(1)
    t = {}
    for i, k in enumerate(layers):
        t[f"layer{i}.o_proj.weight"] = torch.randn(64, len(k["kv_groups"]) * 2 * 8, generator=g) * 0.2
        t[f"layer{i}.down_proj.weight"] = torch.randn(64, len(k["channels"]), generator=g) * 0.2
        if bias:
            t[f"layer{i}.o_proj.bias"] = torch.randn(64, generator=g) * 0.5
            t[f"layer{i}.down_proj.bias"] = torch.randn(64, generator=g) * 0.5
    comp = root / "block0-2.safetensors"
    save_file(t, str(comp))
    return src, keep, [comp]


def cell_model(cell):
    src, keep, comp = cell
    return build_model(str(src), "float32", "cpu", str(keep), [str(c) for c in comp])


def random_windows(n: int = 3, seqlen: int = 48, seed: int = 7) -> torch.Tensor:
    return torch.randint(0, 320, (n, seqlen), generator=torch.Generator().manual_seed(seed))


def text_windows(tok, seqlen: int = 64, n: int = 4) -> torch.Tensor:
    return data.eval_windows(data.tokenize_text(tok, CORPUS), seqlen, n)


def hf_logits(model, windows: torch.Tensor) -> np.ndarray:
    with torch.no_grad():
        return model(input_ids=windows).logits.double().numpy()


def compare(model, tok, path: Path) -> dict:
    """Max |logit diff| relative to the logit scale on random tokens, and the relative
    perplexity difference over text windows, llama.cpp vs the in-memory model."""
    w = random_windows()
    ref = hf_logits(model, w)
    got = gguf_logits(path, w, n_threads=2)
    windows = text_windows(tok)
    ppl_hf = perplexity(model, windows, batch_size=4, progress=False)["ppl"]
    ppl_cpp = gguf_perplexity(path, windows, n_threads=2)["ppl"]
    scale = float(np.abs(ref).max())
    return {
        "diff": float(np.abs(got - ref).max()),
        "scale": scale,
        "rel": float(np.abs(got - ref).max()) / scale,
        "ppl_hf": ppl_hf,
        "ppl_cpp": ppl_cpp,
        "ppl_rel": abs(ppl_cpp / ppl_hf - 1),
    }


def read(path: Path) -> tuple[dict, dict]:
    r = gguf.GGUFReader(str(path))
    return (
        {k: f.contents() for k, f in r.fields.items() if not k.startswith("tokenizer.ggml.")},
        {t.name: t for t in r.tensors},
    )


CASES = [(f, s, b) for f in ("llama", "qwen2") for s in STRUCTURES for b in (False, True)]
OVER = {"llama": {"rope_parameters": LLAMA3_ROPE}, "qwen2": {"tie_word_embeddings": True}}


@pytest.fixture(scope="module")
def cells(tmp_path_factory):
    out = {}
    for f, s, b in CASES:
        root = tmp_path_factory.mktemp(f"{f}-{s}-{'bias' if b else 'nobias'}")
        cell = make_cell(root, f, STRUCTURES[s], b, **OVER[f])
        model, tok = cell_model(cell)
        out[f, s, b] = (root, cell, model, tok)
    return out


@pytest.mark.parametrize(
    "family,structure,bias", CASES, ids=[f"{f}-{s}-{'bias' if b else 'nobias'}" for f, s, b in CASES]
)
def test_f32_gguf_runs_in_llama_cpp_like_the_model(cells, llama_cpp, family, structure, bias):
    root, _, model, tok = cells[family, structure, bias]
    path = root / "f32.gguf"
    rep = write_gguf(model, tok, path, "f32")
    assert rep["arch"] == ("llama" if structure == "uniform" else "deci")
    assert rep["heads"] == [2 * len(k["kv_groups"]) for k in STRUCTURES[structure]]
    assert rep["verify"]["max_abs_err"] == {"f32": 0.0} and not rep["fallbacks"]
    m = compare(model, tok, path)
    print(f"{family} {structure} bias={bias}: {m}")
    assert m["rel"] <= 1e-4, m
    assert m["ppl_rel"] <= 1e-3, m


# type, max |logit diff| / logit scale, perplexity rel. diff (the 4- and 5-bit types: the error
# of their grid on a tiny random model, measured at most 0.084 / 0.014 (q5) and 0.18 / 0.025 (q4))
QUANT = [
    ("f16", 3e-3, 1e-3),
    ("q8_0", 6e-2, 1e-2),
    ("q5_1", 0.15, 0.03),
    ("q5_0", 0.15, 0.03),
    ("q4_1", 0.3, 0.06),
    ("q4_0", 0.3, 0.06),
]


def test_every_written_type_has_a_tolerance():
    """gguf-py's types here; the K-quant mixes' in test_export_gguf_kquant.py (GRID_TOL)."""
    assert [q[0] for q in QUANT] == [t for t in GGUF_TYPES if t != "f32" and t not in KQUANTS]


@pytest.mark.parametrize("gguf_type,tol,ppl_tol", QUANT, ids=[q[0] for q in QUANT])
@pytest.mark.parametrize("structure", list(STRUCTURES))
def test_quantised_gguf_loads_and_runs(cells, llama_cpp, tmp_path, structure, gguf_type, tol, ppl_tol):
    _, _, model, tok = cells["llama", structure, True]
    path = tmp_path / f"{gguf_type}.gguf"
    rep = write_gguf(model, tok, path, gguf_type)
    _, tensors = read(path)
    # the block type wherever the row width (ggml's ne[0], the HF in_features) is a multiple of 32
    block = gguf_type != "f16"
    for name, t in tensors.items():
        width = int(t.shape[0])
        want = (
            gguf.GGMLQuantizationType.F32
            if len(t.shape) == 1
            else gguf.GGMLQuantizationType.F16
            if not block or width % 32
            else gguf.GGMLQuantizationType[gguf_type.upper()]
        )
        assert t.tensor_type == want, name
    fell = {f["tensor"] for f in rep["fallbacks"]}
    assert fell == {n for n, t in tensors.items() if block and len(t.shape) == 2 and int(t.shape[0]) % 32}
    if block:
        assert fell and all(f"not a multiple of the {gguf_type} block (32)" in f["why"] for f in rep["fallbacks"])
    m = compare(model, tok, path)
    print(f"llama {structure} bias {gguf_type}: {m}")
    assert m["rel"] <= tol, m
    assert m["ppl_rel"] <= ppl_tol, m


QUANTIZED = [t for t in GGUF_TYPES if t not in ("f32", "f16")]  # every block-quantized type written


@pytest.mark.parametrize("gguf_type", QUANTIZED)
def test_every_quantized_type_is_evaluated_without_a_crash(cells, kquant_cell, llama_cpp, tmp_path, gguf_type):
    """The AMX remedy's test: a quantized GGUF is evaluated (not only loaded) by llama.cpp in a
    child process. On a CPU with AMX, llama.cpp built with its AMX kernels and loaded with its
    extra CPU buffers segfaults here (ggml-org/llama.cpp #20824), and the child's death fails
    this test in one line (coec.io.isolated.ProcessCrashed: '... died with SIGSEGV (signal 11)')
    instead of killing pytest; with the project's build (scripts/install_llamacpp.sh) or the
    load-time guard it runs on every x86 CPU."""
    from coec.evaluate.llamacpp.amx import describe

    if gguf_type in KQUANTS:  # the K-quant kernels run only on rows of 256 (conftest's K-quant cell)
        src, keep, comp = kquant_cell
        model, tok = build_model(str(src), "float32", "cpu", str(keep), [str(c) for c in comp])
    else:
        _, _, model, tok = cells["llama", "uniform", True]
    path = tmp_path / f"{gguf_type}.gguf"
    write_gguf(model, tok, path, gguf_type)
    windows = text_windows(tok)
    got = gguf_perplexity(path, windows, n_threads=2)
    ref = perplexity(model, windows, batch_size=4, progress=False)["ppl"]
    assert got["tokens_scored"] == windows.numel() - windows.shape[0]
    assert math.isfinite(got["ppl"]) and abs(got["ppl"] / ref - 1) < 0.25, (got, ref, describe())


def _extra_bufts_and_logits(path: str, window: torch.Tensor) -> tuple[bool, np.ndarray]:
    """(use_extra_bufts the model was loaded with, logits of one window), in a child process."""
    from coec.evaluate.llamacpp.run import load, window_logits

    llm = load(path, window.numel(), 1)
    try:
        return bool(llm.model_params.use_extra_bufts), window_logits(llm, window)
    finally:
        llm.close()


@pytest.mark.parametrize("mode", ["off", "on"])
def test_the_guard_loads_without_extra_buffers_and_the_model_runs(cells, llama_cpp, tmp_path, monkeypatch, mode):
    """COEC_LLAMACPP_EXTRA_BUFTS=off (the guard's decision on an AMX CPU with an AMX build)
    reaches the model parameters llama.cpp loads with, and the q8_0 model gives the model's
    logits either way (run in a child process: 'on' is the crash's setting on such a CPU)."""
    from coec.io.isolated import call_isolated

    _, _, model, tok = cells["llama", "uniform", True]
    path = tmp_path / "q8_0.gguf"
    write_gguf(model, tok, path, "q8_0")
    monkeypatch.setenv("COEC_LLAMACPP_EXTRA_BUFTS", mode)
    w = random_windows(1)[0]
    extra, got = call_isolated(_extra_bufts_and_logits, str(path), w)
    assert extra is (mode == "on")
    ref = hf_logits(model, w[None])[0]
    assert np.abs(got - ref).max() / np.abs(ref).max() < 6e-2


def test_metadata_holds_widths_head_size_biases_and_rope(cells, tmp_path):
    """What llama.cpp's loader reads: the explicit head size, one width (llama) or per-layer
    arrays (deci), biases only where the cell has them, llama3 RoPE factors, tied embeddings."""
    for (family, structure, bias), (_, _, model, tok) in cells.items():
        path = tmp_path / f"{family}-{structure}-{bias}.gguf"
        rep = write_gguf(model, tok, path, "f32")
        meta, tensors = read(path)
        arch = rep["arch"]
        assert meta["general.architecture"] == arch
        assert meta[f"{arch}.attention.key_length"] == meta[f"{arch}.attention.value_length"] == 8
        assert meta[f"{arch}.embedding_length"] == 64 and meta[f"{arch}.block_count"] == 3
        heads = [2 * len(k["kv_groups"]) for k in STRUCTURES[structure]]
        ffn = [len(k["channels"]) for k in STRUCTURES[structure]]
        if arch == "deci":
            assert meta["deci.attention.head_count"] == heads
            assert meta["deci.attention.head_count_kv"] == [h // 2 for h in heads]
            assert meta["deci.feed_forward_length"] == ffn
        else:
            assert meta["llama.attention.head_count"] == heads[0]
            assert meta["llama.feed_forward_length"] == ffn[0]
        qkv_bias, out_bias = family == "qwen2", bias
        for i in range(3):
            assert (f"blk.{i}.attn_q.bias" in tensors) == qkv_bias
            assert (f"blk.{i}.attn_output.bias" in tensors) == out_bias
            assert (f"blk.{i}.ffn_down.bias" in tensors) == out_bias
            assert f"blk.{i}.ffn_gate.bias" not in tensors
            assert tuple(tensors[f"blk.{i}.attn_q.weight"].shape) == (64, heads[i] * 8)
            assert tuple(tensors[f"blk.{i}.ffn_down.weight"].shape) == (ffn[i], 64)
        assert ("output.weight" in tensors) == (family == "llama")  # qwen2 cells are tied
        if family == "llama":
            want = rope_freq_factors(LLAMA3_ROPE, 8).numpy()
            np.testing.assert_array_equal(tensors["rope_freqs.weight"].data, want)
            assert meta["llama.rope.freq_base" if arch == "llama" else "deci.rope.freq_base"] == 500000.0
        info = json.loads(meta["coec.export.stage"])
        assert info["arch"] == arch


def test_qk_rows_follow_the_converters_permutation(cells, tmp_path):
    """q/k rows (and Qwen2's q/k biases) as llama.cpp's converter writes them for NORM RoPE;
    v, o and the MLP as they are."""
    _, _, model, tok = cells["qwen2", "per-layer", True]
    path = tmp_path / "m.gguf"
    write_gguf(model, tok, path, "f32")
    _, tensors = read(path)

    def converter_permute(w, n_head):  # convert_hf_to_gguf.py LlamaModel.permute
        return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)

    for i, layer in enumerate(model.model.layers):
        a = layer.self_attn
        nq, nk = a.q_proj.out_features // 8, a.k_proj.out_features // 8
        for name, lin, n in (("attn_q", a.q_proj, nq), ("attn_k", a.k_proj, nk)):
            for s in ("weight", "bias"):
                src = getattr(lin, s).detach().numpy()
                np.testing.assert_array_equal(tensors[f"blk.{i}.{name}.{s}"].data, converter_permute(src, n))
        np.testing.assert_array_equal(tensors[f"blk.{i}.attn_v.bias"].data, a.v_proj.bias.detach().numpy())
        np.testing.assert_array_equal(tensors[f"blk.{i}.attn_output.weight"].data, a.o_proj.weight.detach().numpy())


def test_permute_qk_pairs_the_halves_of_each_head():
    w = torch.arange(2 * 8, dtype=torch.float32)[:, None].repeat(1, 3)  # 2 heads of 8 rows
    p = permute_qk(w, 2)[:, 0].tolist()
    assert p == [0, 4, 1, 5, 2, 6, 3, 7, 8, 12, 9, 13, 10, 14, 11, 15]
    with pytest.raises(ValueError):
        permute_qk(torch.zeros(6, 2), 2)


def test_tensor_type_falls_back_per_tensor():
    Q = gguf.GGMLQuantizationType
    assert tensor_type((64,), "q8_0") == (Q.F32, None)
    assert tensor_type((64, 64), "q8_0") == (Q.Q8_0, None)
    qt, why = tensor_type((64, 48), "q8_0")
    assert qt == Q.F16 and "48" in why
    assert tensor_type((64, 48), "f16") == (Q.F16, None)
    assert tensor_type((64, 48), "f32") == (Q.F32, None)
    for t in ("q5_1", "q5_0", "q4_1", "q4_0"):
        assert tensor_type((64, 64), t) == (Q[t.upper()], None)
        why = f"row width 48 is not a multiple of the {t} block (32); written as f16"
        assert tensor_type((64, 48), t) == (Q.F16, why)
    with pytest.raises(ValueError, match="unknown GGUF tensor type"):
        tensor_type((4, 4), "q3_k")
    with pytest.raises(ValueError, match="q4_k_m is written by llama.cpp's quantizer"):
        tensor_type((4, 4), "q4_k_m")
    export = build_parser()._subparsers._group_actions[0].choices["export"]
    flag = next(a for a in export._actions if "--gguf-type" in a.option_strings)
    assert tuple(flag.choices) == GGUF_TYPES  # the CLI offers what the writer writes


def test_llama_cpp_tokenises_text_like_the_source_tokenizer(cells, llama_cpp, tmp_path):
    """The tokenizer keys (tokens, merges, pre-tokenizer) reproduce the HF tokenizer's ids on
    text, for the byte-level GPT-2 split (llama cell) and Qwen2's split regex (qwen2 cell)."""
    from coec.evaluate.llamacpp.run import load

    text = CORPUS[:1500] + " Don't 123 4567 tabs\tand  spaces\nnew lines"
    for family, pre in (("llama", "gpt-2"), ("qwen2", "qwen2")):
        _, _, model, tok = cells[family, "uniform", False]
        path = tmp_path / f"{family}.gguf"
        rep = write_gguf(model, tok, path, "f32")
        assert rep["tokenizer"]["model"] == "gpt2" and rep["tokenizer"]["pre"] == pre
        llm = load(path, 64)
        try:
            ids = llm.tokenize(text.encode(), add_bos=False)
            assert llm.detokenize(ids).decode() == text
        finally:
            llm.close()
        assert ids == tok.encode(text, add_special_tokens=False)


def test_tokenizer_is_copied_from_a_source_gguf(cells, tmp_path):
    _, _, model, tok = cells["llama", "uniform", False]
    first = tmp_path / "a.gguf"
    write_gguf(model, tok, first, "f32")
    second = tmp_path / "b.gguf"
    rep = write_gguf(model, tok, second, "f32", GgufOptions(tokenizer_gguf=first))
    assert rep["tokenizer"]["source"] == str(first)

    def tok_fields(p):
        r = gguf.GGUFReader(str(p))
        return {k: f.contents() for k, f in r.fields.items() if k.startswith("tokenizer.")}

    assert tok_fields(first) == tok_fields(second) and tok_fields(first)["tokenizer.ggml.merges"]


# ----------------------------------------------------------------------------- other families
@pytest.fixture(scope="module")
def family_cells(tmp_path_factory):
    def make(family, layers, bias, **over):
        root = tmp_path_factory.mktemp(f"{family}-{len(layers)}-{bias}")
        return root, cell_model(make_cell(root, family, layers, bias, **over))

    return make


@pytest.mark.parametrize("family,arch", [("qwen3", "qwen3"), ("granite", "granite")])
def test_qwen3_and_granite_uniform_cells_run(family_cells, llama_cpp, family, arch):
    """Qwen3's per-head q/k norms go to llama.cpp's qwen3 arch (rotate-half RoPE, rows as they
    are); Granite's four multipliers to its granite arch."""
    root, (model, tok) = family_cells(family, UNIFORM, False)
    path = root / "m.gguf"
    rep = write_gguf(model, tok, path, "f32")
    assert rep["arch"] == arch
    m = compare(model, tok, path)
    print(f"{family}: {m}")
    assert m["rel"] <= 1e-4 and m["ppl_rel"] <= 1e-3, m


@pytest.mark.parametrize(
    "family,layers,bias,over,match",
    [
        ("qwen3", UNIFORM, True, {}, r"qwen3: no slot for blk\.N\.attn_output\.bias, blk\.N\.ffn_down\.bias"),
        ("qwen3", PER_LAYER, False, {}, "qwen3: one width for all blocks"),
        ("granite", PER_LAYER, False, {}, "granite: one width for all blocks"),
        ("mistral", UNIFORM, False, {"sliding_window": 16}, "sliding-window attention"),
        ("llama", UNIFORM, False, {"hidden_act": "gelu"}, "hidden_act 'gelu'"),
        (
            "llama",
            UNIFORM,
            False,
            {
                "rope_parameters": {
                    "rope_type": "yarn",
                    "rope_theta": 1e4,
                    "factor": 2.0,
                    "original_max_position_embeddings": 64,
                }
            },
            "RoPE type 'yarn'",
        ),
    ],
    ids=["qwen3-bias", "qwen3-per-layer", "granite-per-layer", "mistral-window", "gelu", "yarn"],
)
def test_what_llama_cpp_cannot_hold_is_refused(family_cells, family, layers, bias, over, match):
    root, (model, tok) = family_cells(family, layers, bias, **over)
    out = root / "refused.gguf"
    before = sorted(p.name for p in root.iterdir())
    with pytest.raises(ValueError, match=match):
        write_gguf(model, tok, out, "f32")
    assert sorted(p.name for p in root.iterdir()) == before  # no file, no temporary left


def test_every_family_names_known_llama_cpp_archs():
    from coec.export.gguf import ARCHS
    from coec.model.arch import ADAPTERS

    for family, adapter in ADAPTERS.items():
        assert adapter.gguf_archs and set(adapter.gguf_archs) <= set(ARCHS), family


def test_mistral_without_window_is_written_as_llama(family_cells):
    root, (model, tok) = family_cells("mistral", UNIFORM, True, sliding_window=None)
    rep = write_gguf(model, tok, root / "m.gguf", "f32")
    assert rep["arch"] == "llama"


# ----------------------------------------------------------------------------- CLI
def test_cli_export_gguf_writes_refuses_and_replaces(cells, tmp_path, capsys):
    _, (src, keep, comp), model, _ = cells["llama", "per-layer", True]
    out = tmp_path / "pruned.gguf"
    args = [
        "export",
        "--model",
        str(src),
        "--keep",
        str(keep),
        "--comp",
        *map(str, comp),
        "--format",
        "gguf",
        "--gguf-type",
        "q8_0",
        "--out",
        str(out),
    ]
    assert main(args) == 0
    meta, tensors = read(out)
    assert meta["general.architecture"] == "deci" and meta["general.file_type"] == 7
    info = json.loads(meta["coec.export.stage"])
    assert info["keep"] == str(keep) and info["gguf_type"] == "q8_0" and info["fallbacks"]
    before = out.read_bytes()
    assert main(args) == 2  # exists: refused without --force
    assert "--force" in capsys.readouterr().err
    assert main([*args, "--force"]) == 0 and out.read_bytes() == before  # deterministic
    other = tmp_path / "notes.gguf"
    other.write_text("my notes")
    assert main([*args[:-1], str(other), "--force"]) == 2  # not ours: never replaced
    assert other.read_text() == "my notes"
    assert main([*args[:-1], str(src / "x.gguf")]) == 2  # inside the source model
    assert not (src / "x.gguf").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.gguf", "pruned.gguf", "pruned.gguf.json"]
    report = json.loads((tmp_path / "pruned.gguf.json").read_text())  # the sidecar: gguf-py's f16 fallbacks
    assert report["written_by"] == "coec" and report["fallback_count"] == len(info["fallbacks"])
    assert [(f["tensor"], f["written"], f["chosen_by"]) for f in report["fallbacks"]] == [
        (f["tensor"], "f16", "coec") for f in info["fallbacks"]
    ]
    assert sum(report["types"].values()) == len(tensors) == report["tensors"]
    with pytest.raises(SystemExit):
        main(["export", "--model", str(src), "--keep", str(keep), "--gguf-type", "f16", "--out", str(tmp_path / "hf")])


def test_iterative_al_am_cell_exports_and_runs(tmp_path, text_dataset, llama_cpp):
    """A real cell of the iterative method (FLAP's AL-AM structure, bias compensation), from
    ``coec iterative run`` through ``coec export --format gguf`` to llama.cpp."""
    src = make_model_dir(tmp_path / "src", "llama", **SHAPE)
    domains = [{"name": "local", "alpha": 1.0, "dataset": text_dataset}]
    out = tmp_path / "it"
    assert (
        main(
            [
                "iterative",
                "run",
                "--model",
                str(src),
                "--domains",
                json.dumps(domains),
                "--nsamples",
                "6",
                "--seqlen",
                "24",
                "--batch-size",
                "4",
                "--ratio",
                "0.4",
                "--steps",
                "2",
                "--structure",
                "al-am",
                "--device",
                "cpu",
                "--quiet",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    keep, comp = out / "keep.json", sorted(out.glob("block*.safetensors"))
    path = tmp_path / "cell.gguf"
    assert (
        main(
            [
                "export",
                "--model",
                str(src),
                "--keep",
                str(keep),
                "--comp",
                *map(str, comp),
                "--format",
                "gguf",
                "--out",
                str(path),
            ]
        )
        == 0
    )
    model, tok = build_model(str(src), "float32", "cpu", str(keep), [str(c) for c in comp])
    layers = json.loads(keep.read_text())["layers"]
    meta, tensors = read(path)
    widths = {(len(k["kv_groups"]), len(k["channels"])) for k in layers}
    assert meta["general.architecture"] == ("deci" if len(widths) > 1 else "llama")
    assert "blk.0.attn_output.bias" in tensors and "blk.0.ffn_down.bias" in tensors
    m = compare(model, tok, path)
    print(f"al-am widths {sorted(widths)}: {m}")
    assert m["rel"] <= 1e-4 and m["ppl_rel"] <= 1e-3, m
