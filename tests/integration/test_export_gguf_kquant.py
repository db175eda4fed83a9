"""GGUF exports of llama.cpp's quantizer mixes (q6_k, q5_k_m, q4_k_m and, below 4 bits, iq4_xs,
q3_k_m, q3_k_s, q2_k): made by llama.cpp's own quantizer from an f32 file of ours; the types read
back, the sidecar's fallbacks equal those the row widths predict (a row width that is not a
multiple of 256 falls back, to the mix's 32-value type), llama.cpp's logits match the in-memory
model within the quantizer's own accuracy and give a finite perplexity, ``--gguf-fallback refuse``
writes nothing, ``--force`` replaces a K-quant file (the provenance survives the quantizer)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch

from coec.cli import main
from coec.evaluate.llamacpp.run import gguf_logits, unavailable
from coec.evaluate.ppl import summed_nll
from coec.export.formats import ExportRequest
from coec.export.gguf import GGUF_TYPES, is_gguf_export
from coec.export.gguf.layout import K_BLOCK, KQUANT_TYPES, KQUANTS
from coec.export.stage import run_export
from coec.model.cell import build_model
from conftest import KQUANT_LAYERS, KQUANT_SHAPE

Q = gguf.GGMLQuantizationType
LLAMA_FTYPE = {
    "q6_k": "LLAMA_FTYPE_MOSTLY_Q6_K",
    "q5_k_m": "LLAMA_FTYPE_MOSTLY_Q5_K_M",
    "q4_k_m": "LLAMA_FTYPE_MOSTLY_Q4_K_M",
    "iq4_xs": "LLAMA_FTYPE_MOSTLY_IQ4_XS",
    "q3_k_m": "LLAMA_FTYPE_MOSTLY_Q3_K_M",
    "q3_k_s": "LLAMA_FTYPE_MOSTLY_Q3_K_S",
    "q2_k": "LLAMA_FTYPE_MOSTLY_Q2_K",
}
# the mixes' main type (the Q4_K_M / Q5_K_M mixes give some tensors Q6_K on purpose, Q3_K_M some
# Q4_K / Q5_K, Q2_K some Q3_K)
MAIN = {
    "q6_k": Q.Q6_K,
    "q5_k_m": Q.Q5_K,
    "q4_k_m": Q.Q4_K,
    "iq4_xs": Q.IQ4_XS,
    "q3_k_m": Q.Q3_K,
    "q3_k_s": Q.Q3_K,
    "q2_k": Q.Q2_K,
}
# what a row width that is not a multiple of 256 (but is of 32) falls back to, by the type the mix
# chose for the tensor (llama.cpp's tensor_type_fallback)
FALLBACK = {Q.Q6_K: Q.Q8_0, Q.Q5_K: Q.Q5_1, Q.Q4_K: Q.Q5_0, Q.Q3_K: Q.Q4_0, Q.Q2_K: Q.Q4_0, Q.IQ4_XS: Q.IQ4_NL}
# the types the mixes below 4 bits fall back to in this cell (Q3_K_M's attn_output and ffn_down are
# Q4_K -> Q5_0; Q2_K's are Q3_K -> Q4_0)
LOW_BIT_FALLBACKS = {"iq4_xs": {Q.IQ4_NL}, "q3_k_m": {Q.Q4_0, Q.Q5_0}, "q3_k_s": {Q.Q4_0}, "q2_k": {Q.Q4_0}}
# max |logit diff| / logit scale. llama.cpp vs the model on the quantizer's grid (its weights
# dequantized from the file): what llama.cpp adds (8-bit activations in the quantized dot
# products), measured at most 0.027 (the q8_0 file's tolerance is 0.06)
ACTIVATION_TOL = 0.05
# the model on the grid vs the model: the quantizer's own error, measured at most 0.065 (q6_k),
# 0.151 (q5_k_m), 0.268 (q4_k_m), 0.307 (iq4_xs), 0.441 (q3_k_m), 0.546 (q3_k_s), 0.757 (q2_k) on
# these tiny random models (the gguf-py types: q5 0.15, q4 0.3)
GRID_TOL = {"q6_k": 0.1, "q5_k_m": 0.2, "q4_k_m": 0.35, "iq4_xs": 0.4, "q3_k_m": 0.55, "q3_k_s": 0.7, "q2_k": 0.95}


@pytest.fixture(scope="module")
def llama_cpp():
    why = unavailable()
    if why:
        pytest.skip(why)


def export(src, keep, comp, out: Path, gguf_type: str, *extra: str) -> int:
    args = ["export", "--model", str(src), "--format", "gguf", "--gguf-type", gguf_type, "--out", str(out)]
    if keep is not None:
        args += ["--keep", str(keep), "--comp", *map(str, comp)]
    return main([*args, *extra])


def predicted(src: Path, keep_layers: list[dict] | None) -> dict[str, int]:
    """The 2-D tensors whose row width (ggml ne[0], HF in_features) is not a multiple of 256,
    with that width, computed from the shapes alone."""
    h, hd = KQUANT_SHAPE["hidden_size"], KQUANT_SHAPE["head_dim"]
    layers = (
        keep_layers
        or [
            {
                "kv_groups": list(range(KQUANT_SHAPE["num_key_value_heads"])),
                "channels": range(KQUANT_SHAPE["intermediate_size"]),
            }
        ]
        * KQUANT_SHAPE["num_hidden_layers"]
    )
    rows = {"token_embd.weight": h, "output.weight": h}
    for i, k in enumerate(layers):
        rows |= {f"blk.{i}.{n}.weight": h for n in ("attn_q", "attn_k", "attn_v", "ffn_gate", "ffn_up")}
        rows[f"blk.{i}.attn_output.weight"] = len(k["kv_groups"]) * 2 * hd
        rows[f"blk.{i}.ffn_down.weight"] = len(k["channels"])
    return {n: w for n, w in rows.items() if w % K_BLOCK}


def unpermute_qk(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    """The inverse of coec.export.gguf.permute_qk (llama.cpp's consecutive-pair rows -> rotate-half)."""
    return w.reshape(n_heads, w.shape[0] // n_heads // 2, 2, *w.shape[1:]).transpose(1, 2).reshape(w.shape)


def grid_model(model, path: Path):
    """A copy of ``model`` whose weights are those the GGUF file holds, dequantized (gguf-py):
    the model on the quantizer's grid, the oracle of what llama.cpp should compute."""
    import copy

    from coec.model.arch import adapter_for

    m = copy.deepcopy(model)
    adapter = adapter_for(m.config)
    tensors = {t.name: t for t in gguf.GGUFReader(str(path)).tensors}

    def load(name: str, param: torch.Tensor, heads: int | None = None) -> None:
        t = tensors[name]
        shape = tuple(reversed([int(s) for s in t.shape]))
        w = torch.from_numpy(gguf.quants.dequantize(np.asarray(t.data), t.tensor_type).reshape(shape).copy())
        param.data.copy_(unpermute_qk(w, heads) if heads else w)

    top = adapter.gguf_model_modules(m)
    load("token_embd.weight", top["token_embd"].weight)
    if "output.weight" in tensors:
        load("output.weight", top["output"].weight)
    hd = KQUANT_SHAPE["head_dim"]
    for i, layer in enumerate(adapter.decoder_layers(m)):
        for name, mod in adapter.gguf_layer_modules(layer).items():
            heads = mod.weight.shape[0] // hd if name in ("attn_q", "attn_k") else None
            load(f"blk.{i}.{name}.weight", mod.weight, heads)
    return m


def hf_logits(model, windows):
    with torch.no_grad():
        return model(input_ids=windows).logits.double().numpy()


def test_every_k_quant_is_offered_and_numbered_as_llama_cpp():
    lib = pytest.importorskip("llama_cpp")
    from coec.export.gguf.layout import file_type

    assert set(KQUANTS) <= set(GGUF_TYPES) and set(MAIN) == set(GRID_TOL) == set(KQUANTS)
    for t in KQUANTS:  # general.file_type is the llama_ftype the quantizer is asked for
        assert file_type(t) == getattr(lib, LLAMA_FTYPE[t])


@pytest.mark.parametrize("target", ["dense", "cell"])
@pytest.mark.parametrize("gguf_type", KQUANTS)
def test_k_quant_export_types_sidecar_and_logits(kquant_cell, llama_cpp, tmp_path, gguf_type, target):
    src, keep, comp = kquant_cell
    if target == "dense":
        keep, comp = None, []
    out = tmp_path / f"export-{gguf_type}.gguf"
    assert export(src, keep, comp, out, gguf_type) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == [out.name, f"{out.name}.json"]  # no f32 file left
    r = gguf.GGUFReader(str(out))
    assert r.get_field("general.file_type").contents() == int(gguf.LlamaFileType[f"MOSTLY_{gguf_type.upper()}"])
    info = json.loads(r.get_field("coec.export.stage").contents())  # the provenance survives the quantizer
    assert is_gguf_export(out) and info["gguf_type"] == gguf_type and info["keep"] == (str(keep) if keep else None)
    want = predicted(src, None if target == "dense" else KQUANT_LAYERS)
    got = {}
    for t in r.tensors:
        width = int(t.shape[0])
        if len(t.shape) == 1:
            assert t.tensor_type == Q.F32, t.name
        elif width % K_BLOCK:
            assert t.tensor_type not in KQUANT_TYPES, t.name
            got[t.name] = t.tensor_type
            # a block type of 32 where the row takes it, else f16
            assert (t.tensor_type == Q.F16) == bool(width % 32), (t.name, t.tensor_type)
            assert t.tensor_type in {*FALLBACK.values(), Q.F16}, (t.name, t.tensor_type)
            if gguf_type in LOW_BIT_FALLBACKS and t.tensor_type != Q.F16:
                assert t.tensor_type in LOW_BIT_FALLBACKS[gguf_type], (t.name, t.tensor_type)
        else:
            assert t.tensor_type in KQUANT_TYPES, t.name
    assert set(got) == set(want) and want  # some tensors fall back, others do not
    report = json.loads(Path(f"{out}.json").read_text())
    assert report["type"] == gguf_type and report["written_by"] == "llama.cpp quantizer"
    assert report["sha256"] == hashlib.sha256(out.read_bytes()).hexdigest()
    assert report["fallback_count"] == len(want) and report["tensors"] == len(r.tensors)
    assert {f["tensor"]: f["shape"][-1] for f in report["fallbacks"]} == want
    for f in report["fallbacks"]:
        assert f["requested"] == gguf_type and f["chosen_by"] == "llama.cpp quantizer"
        assert f["written"] == got[f["tensor"]].name.lower()
        assert f["reason"].startswith(f"row width {f['shape'][-1]} is not a multiple of the K-quant block (256)")
    assert report["types"] == {
        n: sum(t.tensor_type.name == n for t in r.tensors) for n in {t.tensor_type.name for t in r.tensors}
    }
    assert report["types"][MAIN[gguf_type].name] > 0 and report["quantize_seconds"] > 0
    assert report["dense_widths"] == {
        "hidden_size": 256,
        "intermediate_size": 384,
        "block": 256,
        "quantize": {"hidden_size": True, "intermediate_size": False},
    }
    model, _ = build_model(str(src), "float32", "cpu", str(keep) if keep else None, [str(c) for c in comp])
    w = torch.randint(0, 320, (2, 32), generator=torch.Generator().manual_seed(7))
    ref, grid = hf_logits(model, w), hf_logits(grid_model(model, out), w)
    got = gguf_logits(out, w, n_threads=2)
    # llama.cpp's perplexity of the windows (coec ppl --gguf's NLL sum): finite, and near the model's
    ppl = {
        k: float(np.exp(summed_nll(torch.from_numpy(x), w).item() / w[:, 1:].numel()))
        for k, x in (("cpp", got), ("ref", ref))
    }
    assert np.isfinite(ppl["cpp"]) and 0.5 < ppl["cpp"] / ppl["ref"] < 2, ppl
    scale = float(np.abs(ref).max())
    rel = {
        "cpp": float(np.abs(got - ref).max()) / scale,  # llama.cpp vs the model
        "grid": float(np.abs(grid - ref).max()) / scale,  # the quantizer's own error
        "cpp_grid": float(np.abs(got - grid).max()) / scale,  # what llama.cpp adds to it
    }
    print(f"{gguf_type} {target}: {rel}, ppl {ppl}, types {report['types']}, {out.stat().st_size} bytes")
    assert rel["cpp_grid"] <= ACTIVATION_TOL, rel  # llama.cpp computes the file's model
    assert 0 < rel["grid"] <= GRID_TOL[gguf_type], rel  # whose weights are the model's, on the grid


def test_refuse_writes_nothing_and_names_the_first_fallback(kquant_cell, llama_cpp, tmp_path, capsys):
    src, keep, comp = kquant_cell
    for gguf_type, n, first in (
        ("q4_k_m", 2, "blk.1.attn_output.weight, row width 192 not a multiple of 256"),
        ("q8_0", 1, "blk.1.ffn_down.weight, row width 200 not a multiple of 32"),
    ):
        out = tmp_path / f"export-{gguf_type}.gguf"
        assert export(src, keep, comp, out, gguf_type, "--gguf-fallback", "refuse") == 2
        err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("coec export: error:")]
        assert err == [
            f"coec export: error: {gguf_type} would fall back on {n} tensor{'s' if n > 1 else ''} (first: {first}); "
            f"pass --gguf-fallback allow or choose widths that are multiples of {256 if n == 2 else 32}"
        ]
        assert list(tmp_path.iterdir()) == []  # no GGUF, no sidecar, no temporary file


def test_refuse_passes_when_every_width_takes_the_k_quant_block(kquant_cell, llama_cpp, tmp_path):
    src, _, _ = kquant_cell
    keep = tmp_path / "keep.json"  # all heads, 256 of 384 channels, uncompensated
    keep.write_text(json.dumps({"layers": [{"kv_groups": [0, 1, 2, 3], "channels": list(range(256))}] * 2}))
    out = tmp_path / "out" / "export-q6_k.gguf"
    assert export(src, keep, [], out, "q6_k", "--gguf-fallback", "refuse") == 0
    report = json.loads(Path(f"{out}.json").read_text())
    assert report["fallbacks"] == [] and report["fallback_count"] == 0
    assert set(report["types"]) == {"F32", "Q6_K"}


def test_force_replaces_a_k_quant_export_and_never_a_foreign_sidecar(kquant_cell, llama_cpp, tmp_path, capsys):
    src, keep, comp = kquant_cell
    out = tmp_path / "export-q5_k_m.gguf"
    assert export(src, keep, comp, out, "q5_k_m") == 0
    sidecar = Path(f"{out}.json")
    first = json.loads(sidecar.read_text())
    assert export(src, keep, comp, out, "q5_k_m") == 2  # exists: refused without --force
    assert "--force" in capsys.readouterr().err
    assert export(src, keep, comp, out, "q5_k_m", "--force") == 0  # recognised as ours after the quantizer
    assert is_gguf_export(out) and json.loads(sidecar.read_text())["sha256"] == first["sha256"]  # deterministic
    other = tmp_path / "notes.gguf"
    Path(f"{other}.json").write_text("my notes")
    assert export(src, keep, comp, other, "q5_k_m", "--force") == 2  # a sidecar not ours: never replaced
    assert Path(f"{other}.json").read_text() == "my notes" and not other.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([out.name, sidecar.name, "notes.gguf.json"])


def _no_build(*args, **kwargs):
    raise AssertionError("the model was built before the refusal")


@pytest.mark.parametrize(
    "options,match",
    [
        ({"gguf_type": "q3_k"}, r"^unknown GGUF tensor type 'q3_k'; expected one of f32, f16, q8_0, q6_k"),
        ({"gguf_type": "q2_k_s"}, r"^unknown GGUF tensor type 'q2_k_s'; expected one of .*, q3_k_s, q2_k$"),
        ({"gguf_type": "q4_k_m", "gguf_fallback": "sometimes"}, r"^--gguf-fallback 'sometimes': expected one of allow"),
    ],
)
def test_bad_options_are_refused_before_building_anything(kquant_cell, tmp_path, monkeypatch, options, match):
    from coec.model import cell

    monkeypatch.setattr(cell, "build_model", _no_build)
    src, _, _ = kquant_cell
    with pytest.raises(ValueError, match=match) as err:
        run_export(ExportRequest(str(src), None, (), "float32", str(tmp_path / "x.gguf"), options=options), fmt="gguf")
    assert "\n" not in str(err.value) and list(tmp_path.iterdir()) == []


def test_a_mix_that_needs_an_importance_matrix_is_refused_before_anything_without_one(
    kquant_cell, llama_cpp, tmp_path, monkeypatch, capsys
):
    """llama.cpp's quantizer refuses some mixes without an importance matrix (its IQ types below 4
    bits, Q2_K_S); none of the offered ones (layout.NEEDS_IMATRIX is empty: q2_k, iq4_xs and the
    Q3_K mixes export without one, above). A mix named there is refused in one line before the
    model is built or a file written, by the CLI and by write_gguf."""
    from coec.export.gguf import layout
    from coec.model import cell

    monkeypatch.setattr(layout, "NEEDS_IMATRIX", frozenset({"q2_k"}))
    monkeypatch.setattr(cell, "build_model", _no_build)
    src, keep, comp = kquant_cell
    out = tmp_path / "export-q2_k.gguf"
    assert export(src, keep, comp, out, "q2_k") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == (
        "coec export: error: --gguf-type q2_k needs an importance matrix (llama.cpp's quantizer refuses it without "
        "one); pass --imatrix (coec imatrix; in the workflow: export-q2_k-imatrix.gguf)"
    )
    assert list(tmp_path.iterdir()) == []
    from coec.export.gguf import write_gguf

    with pytest.raises(ValueError, match=r"^--gguf-type q2_k needs an importance matrix"):
        write_gguf(None, None, out, "q2_k")  # refused before the model is read
    assert list(tmp_path.iterdir()) == []


def test_k_quant_without_the_bindings_is_one_line_naming_the_install(kquant_cell, tmp_path, monkeypatch):
    from coec.evaluate.llamacpp import run as llamacpp
    from coec.model import cell

    monkeypatch.setattr(cell, "build_model", _no_build)
    monkeypatch.setattr(llamacpp, "unavailable", lambda: "llama-cpp-python is not importable: ImportError: x")
    src, _, _ = kquant_cell
    with pytest.raises(ValueError, match=r"^--gguf-type q4_k_m .*install it with: bash scripts/setup\.sh --llamacpp$"):
        run_export(
            ExportRequest(str(src), None, (), "float32", str(tmp_path / "x.gguf"), options={"gguf_type": "q4_k_m"}),
            fmt="gguf",
        )
    assert list(tmp_path.iterdir()) == []
