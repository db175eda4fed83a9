"""The importance matrix (coec.export.imatrix): the hooks' per-column mean of x^2 equals a direct
computation of each weight's input (the calibration's own Grams for o_proj / down_proj), shared
inputs agree, pruned cells give their own widths; the file's checks and the quantizer's array."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from coec.export.imatrix import FORMAT, SumSq, check_imatrix, collect, imatrix_metadata, imatrix_modules, read_imatrix
from coec.model.arch import adapter_for
from conftest import KQUANT_LAYERS, KQUANT_SHAPE, tiny_config


@pytest.fixture(scope="module")
def tiny():
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(tiny_config("llama")).eval()
    ids = torch.randint(0, model.config.vocab_size, (3, 16), generator=torch.Generator().manual_seed(1))
    return model, ids


def test_sumsq_is_the_mean_of_squares_over_every_token():
    acc = SumSq()
    a, b = torch.randn(2, 5, 4), torch.randn(7, 4)
    acc.add("w", a)
    acc.add("w", b)
    x = torch.cat([a.reshape(-1, 4), b])
    assert acc.counts["w"] == 17
    torch.testing.assert_close(acc.means()["w"], x.double().pow(2).mean(0).float())


def test_hooks_equal_a_direct_computation(tiny):
    """attn_q/k/v: the normed block input; output head: the final normed hidden state; o_proj and
    down_proj: the diagonal of the calibration's Grams (an independent accumulation)."""
    from coec.calibrate.layer_pass import LayerRun, run_layerwise

    model, ids = tiny
    adapter = adapter_for(model.config)
    mods = imatrix_modules(adapter, model)
    got = collect(model, mods, ids, batch_size=2).means()
    with torch.no_grad():
        hs = model(input_ids=ids, output_hidden_states=True).hidden_states
    layers = adapter.decoder_layers(model)
    for i, layer in enumerate(layers):
        x = layer.input_layernorm(hs[i]).reshape(-1, hs[i].shape[-1])
        want = x.double().pow(2).mean(0).float()
        for n in ("attn_q", "attn_k", "attn_v"):
            torch.testing.assert_close(got[f"blk.{i}.{n}.weight"], want)
        torch.testing.assert_close(got[f"blk.{i}.ffn_gate.weight"], got[f"blk.{i}.ffn_up.weight"])
    head = "token_embd.weight" if model.config.tie_word_embeddings else "output.weight"
    torch.testing.assert_close(got[head], hs[-1].reshape(-1, hs[-1].shape[-1]).double().pow(2).mean(0).float())
    grams = {}
    run_layerwise(model, ids, on_layer=lambda i, st: grams.__setitem__(i, st), run=LayerRun(batch_size=3))
    for i, st in grams.items():
        for mod, name in (("o_proj", "attn_output"), ("down_proj", "ffn_down")):
            diag = st[mod].sumsq / st[mod].count
            torch.testing.assert_close(got[f"blk.{i}.{name}.weight"], diag.float(), rtol=1e-4, atol=1e-7)
    assert set(got) == {f"blk.{i}.{n}.weight" for i in range(len(layers)) for n in _LINEAR} | {head}


_LINEAR = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")


def test_pruned_cell_has_its_own_widths(kquant_cell):
    from coec.model.cell import build_model

    src, keep, comp = kquant_cell
    model, _ = build_model(str(src), "float32", "cpu", str(keep), [str(c) for c in comp])
    ids = torch.randint(0, model.config.vocab_size, (2, 8), generator=torch.Generator().manual_seed(0))
    got = collect(model, imatrix_modules(adapter_for(model.config), model), ids, 2).means()
    h = KQUANT_SHAPE["hidden_size"]
    for i, k in enumerate(KQUANT_LAYERS):
        assert got[f"blk.{i}.attn_output.weight"].shape == (len(k["kv_groups"]) * 2 * KQUANT_SHAPE["head_dim"],)
        assert got[f"blk.{i}.ffn_down.weight"].shape == (len(k["channels"]),)
        assert got[f"blk.{i}.attn_q.weight"].shape == (h,)
    assert all(bool((v > 0).all()) for v in got.values())


def _write(path, vectors: dict, meta: dict | None = None) -> None:
    from safetensors.numpy import save_file

    save_file(vectors, str(path), metadata=meta or imatrix_metadata(10, {}, {}, {}))


def test_read_imatrix_refuses_other_files_and_bad_values(tmp_path):
    ok = tmp_path / "ok.safetensors"
    _write(ok, {"blk.0.attn_q.weight": np.ones(4, np.float32)})
    im = read_imatrix(ok)
    assert im.tokens == 10 and len(im.sha256) == 64 and im.record()["entries"] == 1
    cases = {
        "format": ({"a": np.ones(4, np.float32)}, {"format": "other"}),
        "non-finite": ({"a": np.array([1, np.nan], np.float32)}, None),
        "negative": ({"a": np.array([1, -1], np.float32)}, None),
        "float32 vector": ({"a": np.ones((2, 2), np.float32)}, None),
    }
    for what, (vectors, meta) in cases.items():
        p = tmp_path / f"{what}.safetensors"
        _write(p, vectors, meta)
        with pytest.raises(ValueError, match=what) as exc:
            read_imatrix(p)
        assert "\n" not in str(exc.value)
    assert FORMAT == "coec-imatrix"


def test_check_imatrix_names_widths_and_missing_weights():
    shapes = {"blk.0.attn_q.weight": (8, 4), "blk.0.ffn_down.weight": (4, 6), "output_norm.weight": (4,)}
    good = {"blk.0.attn_q.weight": np.ones(4, np.float32), "blk.0.ffn_down.weight": np.ones(6, np.float32)}
    check_imatrix(good, shapes, "f")
    with pytest.raises(ValueError, match="has 5 values, the tensor's row width is 6"):
        check_imatrix({**good, "blk.0.ffn_down.weight": np.ones(5, np.float32)}, shapes, "f")
    with pytest.raises(ValueError, match="blk.9.attn_q.weight is not a weight of this export"):
        check_imatrix({**good, "blk.9.attn_q.weight": np.ones(4, np.float32)}, shapes, "f")
    with pytest.raises(ValueError, match="output_norm.weight is not a weight"):
        check_imatrix({**good, "output_norm.weight": np.ones(4, np.float32)}, shapes, "f")
    with pytest.raises(ValueError, match="no vector for blk.0.ffn_down.weight"):
        check_imatrix({"blk.0.attn_q.weight": np.ones(4, np.float32)}, shapes, "f")


def test_quantizer_array_names_sizes_and_null_end():
    from coec.evaluate.llamacpp.run import unavailable

    if why := unavailable():
        pytest.skip(why)
    import ctypes

    from coec.model.arch.gguf import bindings_imatrix

    vectors = {"b.weight": np.arange(3, dtype=np.float32), "a.weight": np.array([5.0, 6.0], np.float64)}
    arr, keep = bindings_imatrix(vectors)
    assert len(arr) == 3 and keep
    assert [arr[0].name, arr[1].name, arr[2].name] == [b"a.weight", b"b.weight", None]
    assert [arr[0].size, arr[1].size, arr[2].size] == [2, 3, 0]
    for i, name in enumerate(("a.weight", "b.weight")):
        got = np.ctypeslib.as_array(ctypes.cast(arr[i].data, ctypes.POINTER(ctypes.c_float)), shape=(arr[i].size,))
        np.testing.assert_array_equal(got, vectors[name].astype(np.float32))
