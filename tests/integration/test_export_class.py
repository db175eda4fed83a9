"""The HF export's class is chosen so that vLLM and llama.cpp's converter read the cell as
transformers does (``coec.model.arch.runtimes``: read from vLLM 0.33.0's and llama.cpp's code, not run);
when no class can, the export warns and records why. Every export is reloaded from disk and its
logits checked; the dense model exports through the same code (no keep set)."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import torch

from coec.cli import main
from coec.export.formats import ExportRequest
from coec.export.hf_class import ExportNeeds, choose_export_class
from coec.export.stage import MARKER, run_export
from coec.model.arch import STOCK
from coec.model.arch.runtimes import CONVERTER, FAILS, MISREAD, OK, READS, RUNTIMES, VLLM, verdict
from coec.model.cell import build_model
from coec.model.load import ModelError
from conftest import make_model_dir

# 8 query heads of head_dim 8 in 4 KV groups, hidden 64, 48 MLP channels (24 kept)
WIDE = dict(hidden_size=64, num_attention_heads=8, num_key_value_heads=4, head_dim=8, intermediate_size=48)
CHANNELS = list(range(0, 48, 2))


def make_cell(root, family: str, kv_groups: list[int], bias: bool):
    """A tiny 2-layer model folder, keep.json and one block file of random compensated weights
    (with FLAP-style o_proj / down_proj biases when ``bias``)."""
    from safetensors.torch import save_file

    src = make_model_dir(root / "src", family, **WIDE)
    keep = root / "keep.json"
    keep.write_text(json.dumps({"layers": [{"kv_groups": kv_groups, "channels": CHANNELS}] * 2}))
    g = torch.Generator().manual_seed(1)
    t = {}
    for i in range(2):
        t[f"layer{i}.o_proj.weight"] = torch.randn(64, len(kv_groups) * 16, generator=g) * 0.2
        t[f"layer{i}.down_proj.weight"] = torch.randn(64, len(CHANNELS), generator=g) * 0.2
        if bias:
            t[f"layer{i}.o_proj.bias"] = torch.randn(64, generator=g) * 0.5
            t[f"layer{i}.down_proj.bias"] = torch.randn(64, generator=g) * 0.5
    comp = root / "block0-1.safetensors"
    save_file(t, str(comp))
    return src, keep, [comp]


def reload_plain(folder):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()


def logits(model, n: int = 40) -> torch.Tensor:
    ids = torch.randint(0, 300, (2, n), generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        return model(input_ids=ids).logits


def needs(**kw) -> ExportNeeds:
    base = dict(
        family="llama",
        qk_norm=False,
        qkv_bias=False,
        o_bias=False,
        mlp_bias=False,
        divides=True,
        sliding=False,
        head_implied=True,
    )
    return ExportNeeds(**{**base, **kw})


def test_every_stock_class_has_rules_for_every_runtime():
    for runtime in RUNTIMES:
        assert set(STOCK) <= set(READS[runtime]), runtime
        for model_type, reads in READS[runtime].items():
            assert reads.source and reads.head in ("config", "implied"), model_type


def test_qwen2_with_pruned_heads_is_not_written_as_qwen2():
    """Qwen2.5-0.5B at 30 % keeps 7 of 14 heads of 64 in a hidden size of 896: vLLM's qwen2 would
    take 896 // 7 = 128 as the head size. Llama honours head_dim and holds Qwen2's q/k/v biases."""
    cell = needs(family="qwen2", qkv_bias=True, divides=896 % 7 == 0, head_implied=896 // 7 == 64)
    assert verdict(VLLM, "qwen2", cell)["status"] == MISREAD
    assert verdict(CONVERTER, "qwen2", cell)["status"] == FAILS
    model_type, reason = choose_export_class(cell)
    assert model_type == "llama" and "qwen2: misread in vLLM" in reason
    # unpruned heads: the source class is read correctly everywhere and kept
    assert choose_export_class(needs(family="qwen2", qkv_bias=True))[0] == "qwen2"
    # 21 of 28 heads in 3584 (Qwen2.5-7B at 30 %): no divisibility, so not llama either
    wide = needs(family="qwen2", qkv_bias=True, divides=False, head_implied=False)
    assert choose_export_class(wide)[0] == "seed_oss"
    assert all(verdict(r, "seed_oss", wide)["status"] == OK for r in RUNTIMES)


@pytest.mark.parametrize(
    "kw",
    [dict(family="qwen3", qk_norm=True, o_bias=True), dict(family="qwen2", qkv_bias=True, o_bias=True, mlp_bias=True)],
)
def test_an_output_bias_never_goes_to_a_class_whose_vllm_model_drops_it(kw):
    cell = needs(**kw)
    model_type, _ = choose_export_class(cell)
    assert verdict(VLLM, model_type, cell)["status"] != MISREAD, model_type
    assert verdict(VLLM, kw["family"], cell)["status"] == MISREAD  # the source class would


def test_verdicts_name_head_size_and_biases():
    flap = needs(divides=False, head_implied=False, o_bias=True, mlp_bias=True)
    v = verdict(CONVERTER, "seed_oss", flap)
    assert v["status"] == FAILS and "o_proj, MLP bias" in v["why"] and "seed-oss.cpp" in v["source"]
    assert verdict(VLLM, "seed_oss", flap)["status"] == OK
    assert verdict(CONVERTER, "granite", flap)["status"] == FAILS  # the converter drops head_dim
    assert verdict(VLLM, "hy_v3", needs(qk_norm=True))["status"] == FAILS
    assert verdict(VLLM, "llama", needs(head_implied=False, o_bias=True))["status"] == OK


@pytest.mark.parametrize(
    "family,kv,bias,arch,clean",
    [
        ("qwen2", [1, 2], False, "LlamaForCausalLM", True),  # 4 heads of 8 in 64: 64 // 4 = 16
        ("llama", [0, 2], True, "LlamaForCausalLM", True),
        ("llama", [0, 1, 3], True, "SeedOssForCausalLM", False),  # converter: no o_proj/MLP bias
    ],
)
def test_export_records_runtimes_and_warns(tmp_path, caplog, family, kv, bias, arch, clean):
    src, keep, comp = make_cell(tmp_path, family, kv, bias)
    with caplog.at_level(logging.WARNING, logger="coec.export.hf_class"):
        info = run_export(
            ExportRequest(str(src), str(keep), tuple(str(c) for c in comp), "float32", str(tmp_path / "out"))
        )
    assert info["architecture"] == arch
    assert info["runtimes"]["transformers"]["status"] == OK
    assert set(info["runtimes"]) == {"transformers", *RUNTIMES}
    assert (not info["warnings"]) == clean
    if not clean:
        assert info["warnings"][0].startswith(CONVERTER + " would fail to load this seed_oss")
        assert "--format gguf" in info["warnings"][0]
        assert any("would fail to load" in r.getMessage() for r in caplog.records)
    marker = json.loads((tmp_path / "out" / MARKER).read_text())["coec_export"]
    assert marker["warnings"] == info["warnings"] and marker["runtimes"] == info["runtimes"]
    assert 0 <= marker["reload_max_abs_logit_diff"] <= 1e-4
    cfg = json.loads((tmp_path / "out/config.json").read_text())
    assert cfg["head_dim"] == 8 and cfg["num_attention_heads"] == 2 * len(kv)
    cell, _ = build_model(str(src), "float32", "cpu", str(keep), [str(c) for c in comp])
    torch.testing.assert_close(logits(reload_plain(tmp_path / "out")), logits(cell), rtol=0, atol=1e-5)


def test_a_checkpoint_that_reloads_differently_is_refused(tmp_path, monkeypatch):
    """The reload check reads what was written: weights changed on disk stop the export and
    leave no folder."""
    from safetensors.torch import load_file, save_file
    from transformers import PreTrainedModel

    src, keep, comp = make_cell(tmp_path, "llama", [0, 2], True)
    save = PreTrainedModel.save_pretrained

    def corrupting(self, folder, *a, **k):
        save(self, folder, *a, **k)
        path = next(Path(folder).glob("*.safetensors"))
        t = load_file(str(path))
        name = next(n for n in t if n.endswith("down_proj.weight"))
        t[name] = t[name] * 2
        save_file(t, str(path), metadata={"format": "pt"})

    monkeypatch.setattr(PreTrainedModel, "save_pretrained", corrupting)
    with pytest.raises(ModelError, match="logits differ"):
        run_export(ExportRequest(str(src), str(keep), tuple(str(c) for c in comp), "float32", str(tmp_path / "out")))
    assert not (tmp_path / "out").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".out.")]


def test_dense_model_exports_without_a_keep_set(tmp_path):
    """No --keep: the unpruned model through the same writers (the dense row of the measured
    table), HF and GGUF."""
    src, _, _ = make_cell(tmp_path, "llama", [0, 1, 2, 3], False)
    assert main(["export", "--model", str(src), "--out", str(tmp_path / "hf")]) == 0
    marker = json.loads((tmp_path / "hf" / MARKER).read_text())["coec_export"]
    assert marker["keep"] is None and marker["architecture"] == "LlamaForCausalLM"
    dense, _ = build_model(str(src), "float32", "cpu")
    torch.testing.assert_close(logits(reload_plain(tmp_path / "hf")), logits(dense), rtol=0, atol=1e-5)
    out = tmp_path / "dense.gguf"
    assert main(["export", "--model", str(src), "--format", "gguf", "--gguf-type", "f16", "--out", str(out)]) == 0
    import gguf

    r = gguf.GGUFReader(str(out))
    assert r.get_field("llama.attention.head_count").contents() == 8
    assert r.get_field("llama.feed_forward_length").contents() == 48 != len(CHANNELS)
