"""The bytes a width search's budget counts (``coec.select.search.budget.model_bytes``) are the bytes of
the GGUF file the export writes: per-layer widths with row widths that take the K-quant block,
only a block of 32, or neither; 9 blocks, so that the q4_k_m / q5_k_m mixes put attn_v and
ffn_down of some blocks (``use_more_bits``) in Q6_K. The K-quant files are made by llama.cpp's
quantizer, so this checks the mix rules of ``coec.export.gguf.mix`` against llama.cpp itself."""

from __future__ import annotations

import json

import gguf
import pytest
import torch
from safetensors.torch import save_file

from coec.cli import main
from coec.evaluate.llamacpp.run import unavailable
from coec.select.search.budget import model_bytes
from conftest import make_model_dir

SHAPE = dict(
    hidden_size=256,
    num_attention_heads=8,
    num_key_value_heads=4,
    head_dim=32,
    intermediate_size=768,
    num_hidden_layers=9,
    initializer_range=0.05,
)
# (kept KV groups, kept channels) per block: o_proj rows 256 / 192 / 128 / 64 wide, down_proj
# rows 768 / 512 / 256 (K-quant block), 64 / 224 (blocks of 32), 200 / 33 / 100 (neither)
WIDTHS = [(4, 768), (3, 512), (2, 200), (1, 256), (4, 33), (3, 768), (2, 64), (4, 224), (1, 100)]


@pytest.fixture(scope="module")
def cell(tmp_path_factory):
    root = tmp_path_factory.mktemp("budget-cell")
    out = {}
    for tied in (False, True):
        src = make_model_dir(root / f"src-{tied}", "llama", tie_word_embeddings=tied, **SHAPE)
        keep = root / "keep.json"
        layers = [{"kv_groups": list(range(k)), "channels": list(range(c))} for k, c in WIDTHS]
        keep.write_text(json.dumps({"layers": layers}))
        g = torch.Generator().manual_seed(1)
        t = {}
        for i, (k, c) in enumerate(WIDTHS):
            t[f"layer{i}.o_proj.weight"] = torch.randn(256, k * 2 * 32, generator=g) * 0.05
            t[f"layer{i}.down_proj.weight"] = torch.randn(256, c, generator=g) * 0.05
        comp = root / "block0-8.safetensors"
        save_file(t, str(comp))
        out[tied] = (src, keep, comp)
    return out


@pytest.mark.parametrize(
    ("gguf_type", "tied"),
    [("q4_k_m", False), ("q4_k_m", True), ("q5_k_m", False), ("q6_k", False), ("q8_0", False), ("f16", True)],
)
def test_model_bytes_are_the_files_tensor_bytes(cell, tmp_path, gguf_type, tied):
    if gguf_type in ("q4_k_m", "q5_k_m", "q6_k") and unavailable():
        pytest.skip(unavailable())
    src, keep, comp = cell[tied]
    out = tmp_path / f"export-{gguf_type}.gguf"
    args = ["export", "--model", str(src), "--format", "gguf", "--gguf-type", gguf_type, "--out", str(out)]
    assert main([*args, "--keep", str(keep), "--comp", str(comp)]) == 0
    written = {t.name: int(t.n_bytes) for t in gguf.GGUFReader(str(out)).tensors}
    config = json.loads((src / "config.json").read_text())
    widths = [{"kv_groups": k, "channels": c} for k, c in WIDTHS]
    assert model_bytes(config, widths, gguf_type) == sum(written.values())
    assert ("output.weight" in written) == (not tied)
