"""Calibration, selection, surgery and perplexity on tiny random Llama / Qwen2 models."""

from __future__ import annotations

import math

import pytest
import torch

from coec.calibrate.layer_pass import (
    GramAccumulator,
    LayerRun,
    NonFiniteActivations,
    gram_block,
    gram_block_edges,
    gram_upper_add_,
    run_layerwise,
    symmetrize_upper_,
)
from coec.data.text import eval_windows, sample_windows
from coec.evaluate.ppl import perplexity, summed_nll
from coec.model.arch import AttnShape, ModelError, attention_shape, head_indices, o_proj_columns
from coec.model.load import check_family, load_model
from coec.model.prune import prune_model_, rewrite_config_, set_output_weights_
from coec.select.scores import (
    KeepRule,
    channel_variance,
    column_scores,
    group_scores,
    n_keep,
    select_layer,
    top_k_sorted,
)
from conftest import make_model_dir, tiny_config


def _ids(n=3, t=24, vocab=320, seed=1):
    return torch.randint(0, vocab, (n, t), generator=torch.Generator().manual_seed(seed))


# ----------------------------------------------------------------------------- calibration
@pytest.mark.parametrize("family", ["llama", "qwen2", "qwen3", "granite"])
def test_grams_equal_explicit_inputs(tmp_path, family):
    """Layer-wise Grams equal X Xᵀ of inputs captured from the full model forward (float64)."""
    path = make_model_dir(tmp_path / family, family, dtype=torch.float64)
    model, _ = load_model(path, dtype="float64")
    ids = _ids()
    captured = {}
    hooks = []
    for i, layer in enumerate(model.model.layers):
        for name, mod in (("o_proj", layer.self_attn.o_proj), ("down_proj", layer.mlp.down_proj)):
            hooks.append(
                mod.register_forward_pre_hook(lambda _m, a, key=(i, name): captured.setdefault(key, []).append(a[0]))
            )
    with torch.no_grad():
        model(input_ids=ids)
    for h in hooks:
        h.remove()
    stats = {}
    run_layerwise(model, ids, on_layer=lambda i, s: stats.update({i: s}), run=LayerRun(batch_size=2, progress=False))
    for (i, name), xs in captured.items():
        X = torch.cat([x.reshape(-1, x.shape[-1]) for x in xs])
        G = X.T @ X
        acc = stats[i][name]
        assert acc.count == X.shape[0]
        assert (acc.gram - G).norm() / G.norm() < 1e-10
        assert torch.allclose(acc.sum, X.sum(0), rtol=1e-10, atol=1e-12)


def gram_product(x, block=None):
    """``x^T x`` of one batch x (t, d) as GramAccumulator forms it: block rows of ``block``
    columns (default ``GRAM_BLOCK`` of x's device), float32 (float64 for float64 x), mirrored."""
    edges = gram_block_edges(x.shape[1], block or gram_block(x.device))
    dtype = torch.float64 if x.dtype == torch.float64 else torch.float32
    G = torch.zeros(x.shape[1], x.shape[1], dtype=dtype, device=x.device)
    return symmetrize_upper_(gram_upper_add_(G, x, edges), edges)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_gram_product_accumulates_in_float32(dtype):
    """16-bit batches: products exact, float32 accumulation -> equal to the float64 Gram of the
    same (16-bit) numbers to float32 round-off, never rounded to 16 bits."""
    g = torch.Generator().manual_seed(0)
    x = (torch.randn(512, 48, generator=g) * torch.logspace(0, 1.5, 48)).to(dtype)
    ref = x.double().mT @ x.double()
    got = gram_product(x)
    assert got.dtype == torch.float32
    assert float((got.double() - ref).norm() / ref.norm()) < 1e-6
    acc = GramAccumulator(48, torch.device("cpu"))
    acc.update(x[:300])
    acc.update(x[300:])
    assert float((acc.gram - ref).norm() / ref.norm()) < 1e-6
    assert torch.allclose(acc.sum, x.double().sum(0), rtol=1e-5, atol=1e-4)


def test_gram_product_cuda_kernel_signature():
    """The 16-bit CUDA path calls ``torch.mm(..., out_dtype=float32)`` on column slices of the
    batch; its schema is checked on meta tensors here (no GPU needed), and against the upcast
    GEMM on a GPU when there is one (three block rows of 1024 columns)."""
    x = torch.empty(64, 16, dtype=torch.bfloat16, device="meta")
    out = torch.mm(x[:, 4:8].mT, x[:, 4:], out_dtype=torch.float32)
    assert out.dtype == torch.float32 and out.shape == (4, 12)
    if torch.cuda.is_available():
        xc = torch.randn(4096, 2304, device="cuda").to(torch.bfloat16)
        ref = xc.float().mT @ xc.float()
        got = gram_product(xc)
        assert float((got - ref).norm() / ref.norm()) < 1e-5 and torch.equal(got, got.mT)


@pytest.mark.parametrize("d,block", [(7, 1), (48, 5), (48, 16), (48, 48), (48, 100), (300, 64)])
def test_blocked_gram_is_the_full_symmetric_gram(d, block):
    """Block rows of ``block`` columns: the Gram equals x^T x (float64 reference), is exactly
    symmetric, forms only the upper block triangle (strictly lower blocks never written), and
    costs about (B + 1) / 2B of the full GEMM's FLOPs; the accumulator's total is right however
    its reads and updates interleave."""
    from torch.utils.flop_counter import FlopCounterMode

    g = torch.Generator().manual_seed(d)
    x = torch.randn(200, d, generator=g, dtype=torch.float64)
    ref = x.mT @ x
    edges = gram_block_edges(d, block)
    n = len(edges) - 1
    assert edges[0] == 0 and edges[-1] == d and n == -(-d // block)
    assert max(b - a for a, b in zip(edges[:-1], edges[1:])) <= block
    got = gram_product(x, block)
    torch.testing.assert_close(got, ref, rtol=1e-12, atol=1e-10)
    assert torch.equal(got, got.mT)
    upper = torch.full((d, d), float("nan"), dtype=torch.float64)
    for lo, hi in zip(edges[:-1], edges[1:]):
        upper[lo:hi, lo:] = 0.0
    with FlopCounterMode(display=False) as fc:
        gram_upper_add_(upper, x, edges)
    lower = torch.ones(d, d, dtype=torch.bool)
    for lo, hi in zip(edges[:-1], edges[1:]):
        lower[lo:hi, lo:] = False
    assert torch.isnan(upper[lower]).all()  # strictly lower blocks: not written
    sizes = [b - a for a, b in zip(edges[:-1], edges[1:])]
    want = sum(2 * 200 * s * (d - a) for s, a in zip(sizes, edges[:-1]))
    assert fc.get_total_flops() == want
    if n >= 4:
        assert want <= 0.7 * 2 * 200 * d * d
    acc = GramAccumulator(d, torch.device("cpu"), block=block)
    acc.update(x[:50])
    first = acc.gram.clone()
    acc.update(x[50:120])
    acc.update(x[120:])
    torch.testing.assert_close(first, x[:50].mT @ x[:50], rtol=1e-12, atol=1e-10)
    torch.testing.assert_close(acc.gram, ref, rtol=1e-12, atol=1e-10)
    assert torch.equal(acc.gram, acc.gram.mT)


def test_nan_activations_raise(llama_dir):
    model, _ = load_model(llama_dir)
    with torch.no_grad():
        model.model.layers[1].mlp.up_proj.weight[0, 0] = float("nan")
    with pytest.raises(NonFiniteActivations, match="layer 1 down_proj"):
        run_layerwise(model, _ids(), run=LayerRun(progress=False))


# ----------------------------------------------------------------------------- selection
def test_scores_hand_computed():
    W = torch.tensor([[3.0, 0.0, 1.0], [4.0, 1.0, 0.0]])  # column norms 5, 1, 1
    X = torch.tensor([[1.0, 2.0, 3.0, 4.0], [0.0, 0.0, 0.0, 2.0], [1.0, 1.0, 1.0, 1.0]])
    G, s, n = X @ X.T, X.sum(1), X.shape[1]
    var = X.var(dim=1, unbiased=True).double()
    assert torch.allclose(channel_variance(G.diagonal(), s, n), var)
    xn = X.norm(dim=1).double()
    wn = torch.tensor([5.0, 1.0, 1.0], dtype=torch.float64)
    assert torch.allclose(column_scores("wanda_sp", W, G.diagonal(), s, n), wn * xn)
    assert torch.allclose(column_scores("flap", W, G.diagonal(), s, n), var * wn**2)
    assert torch.allclose(column_scores("rcpu", W, G.diagonal(), s, n), wn * xn * var)
    # the constant channel has zero variance: flap/rcpu score it 0, wanda_sp does not
    assert column_scores("flap", W, G.diagonal(), s, n)[2] == 0
    assert column_scores("wanda_sp", W, G.diagonal(), s, n)[2] > 0


def test_keep_counts_and_rounding():
    assert n_keep(1536, 0.3) == 1076  # ceil(1075.2)
    assert n_keep(10, 0.1) == 9  # no float error: 0.9*10 = 9.000000000000002
    assert n_keep(8, 0.3) == 6  # ceil(5.6)
    assert n_keep(3, 0.3, "ceil") == 3  # the paper's rule keeps all 3 groups
    assert n_keep(3, 0.3, "nearest") == 2  # round the pruned count: one group goes
    assert n_keep(4, 0.3, "nearest") == 3
    for bad in (0.0, 1.0, -0.1, 1.5):
        with pytest.raises(ValueError, match="ratio"):
            n_keep(10, bad)
    assert n_keep(1536, 0.3, "floor") == 1075  # channel_rounding's third rule
    with pytest.raises(ValueError, match="rounding"):
        n_keep(10, 0.3, "up")


def test_group_selection_keeps_gqa_structure():
    geom = AttnShape(n_heads=6, n_kv=3, head_dim=2)  # 2 query heads per KV head
    col = torch.tensor([1.0, 1, 1, 1, 5, 5, 5, 5, 2, 2, 2, 2], dtype=torch.float64)
    assert group_scores(col, geom).tolist() == [4.0, 20.0, 8.0]
    assert top_k_sorted(group_scores(col, geom), 2) == [1, 2]
    assert head_indices([1, 2], geom) == [2, 3, 4, 5]
    assert o_proj_columns([0, 2], geom).tolist() == [0, 1, 2, 3, 8, 9, 10, 11]
    # a full select_layer on a constructed case: o_proj columns scaled per group
    Wo = torch.diag(torch.tensor([1.0] * 4 + [5.0] * 4 + [2.0] * 4))
    Wd = torch.diag(torch.tensor([1.0, 6, 2, 5, 3, 4]))

    def st(dim):
        return {"gram": torch.eye(dim), "sum": torch.zeros(dim), "count": 10}

    W, S = {"o_proj": Wo, "down_proj": Wd}, {"o_proj": st(12), "down_proj": st(6)}
    keep = select_layer("wanda_sp", W, S, geom, KeepRule(0.3, group_rounding="nearest"))
    assert keep == {"kv_groups": [1, 2], "channels": [1, 2, 3, 4, 5]}  # ceil(0.7*6) = 5 kept
    keep = select_layer("wanda_sp", W, S, geom, KeepRule(0.3, group_rounding="ceil"))
    assert keep["kv_groups"] == [0, 1, 2]


# ----------------------------------------------------------------------------- surgery
def _logits(model, ids):
    with torch.no_grad():
        return model(input_ids=ids).logits


def _all_keep(geom, d_ff, n_layers):
    return {"layers": [{"kv_groups": list(range(geom.n_kv)), "channels": list(range(d_ff))} for _ in range(n_layers)]}


def test_prune_nothing_identical(tiny_dir):
    model, _ = load_model(tiny_dir, dtype="float64")
    ids = _ids()
    ref = _logits(model, ids)
    geom = attention_shape(model.config)
    prune_model_(model, _all_keep(geom, model.config.intermediate_size, 2))
    assert torch.equal(_logits(model, ids), ref)


def test_prune_kv_group_equals_zeroing(tiny_dir, tmp_path):
    """Removing KV group 0 (+ its query heads) and MLP channels == zeroing those o_proj /
    down_proj input columns in the unpruned model; export -> vanilla reload is identical."""
    from transformers import AutoModelForCausalLM

    from coec.export.hf_class import build_export_model

    ids = _ids()
    ref_model, _ = load_model(tiny_dir, dtype="float64")
    model, _ = load_model(tiny_dir, dtype="float64")
    geom = attention_shape(model.config)
    d_ff = model.config.intermediate_size
    channels = [c for c in range(d_ff) if c % 3]  # drop every third channel
    keep = {"layers": [{"kv_groups": [1], "channels": channels}, {"kv_groups": [1], "channels": channels}]}
    prune_model_(model, keep)
    dropped_cols = o_proj_columns([0], geom)
    dropped_ch = [c for c in range(d_ff) if c not in channels]
    with torch.no_grad():
        for layer in ref_model.model.layers:
            layer.self_attn.o_proj.weight[:, dropped_cols] = 0
            layer.mlp.down_proj.weight[:, dropped_ch] = 0
    out = _logits(model, ids)
    torch.testing.assert_close(out, _logits(ref_model, ids), rtol=1e-10, atol=1e-10)
    assert model.config.num_key_value_heads == 1
    assert model.config.num_attention_heads == geom.groups
    assert model.config.head_dim == geom.head_dim
    assert model.config.intermediate_size == len(channels)
    if model.config.model_type == "qwen2":  # q/k/v biases were sliced with their rows
        assert model.model.layers[0].self_attn.k_proj.bias.shape == (geom.head_dim,)
    build_export_model(model)[0].save_pretrained(tmp_path / "pruned")
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path / "pruned", dtype=torch.float64)
    assert torch.equal(_logits(reloaded, ids), out)


def test_bias_save_reload_llama(llama_dir, tmp_path):
    from transformers import AutoModelForCausalLM

    from coec.export.hf_class import build_export_model

    model, _ = load_model(llama_dir, dtype="float64")
    prune_model_(model, {"layers": [{"kv_groups": [0], "channels": list(range(0, 48, 2))}] * 2})
    torch.manual_seed(0)
    for layer in model.model.layers:
        for mod, lin in (("o_proj", layer.self_attn.o_proj), ("down_proj", layer.mlp.down_proj)):
            set_output_weights_(layer, mod, lin.weight.data * 0.9, torch.randn(lin.out_features))
    ids = _ids()
    out = _logits(model, ids)
    build_export_model(model)[0].save_pretrained(tmp_path / "b")  # zero sibling biases
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path / "b", dtype=torch.float64)
    assert reloaded.config.attention_bias and reloaded.config.mlp_bias
    assert torch.equal(_logits(reloaded, ids), out)


# ----------------------------------------------------------------------------- perplexity
def test_perplexity_hand_computed(llama_dir):
    model, _ = load_model(llama_dir, dtype="float64")
    tokens = torch.arange(50) % 300
    windows = eval_windows(tokens, 16, None)
    assert windows.shape == (3, 16)  # trailing 2 tokens dropped
    nll, n = 0.0, 0
    for w in windows:
        logp = torch.log_softmax(_logits(model, w[None])[0], -1)
        for t in range(1, 16):
            nll -= float(logp[t - 1, w[t]])
            n += 1
    res = perplexity(model, windows, batch_size=2, progress=False)
    assert res["tokens_scored"] == n == 45
    assert math.isclose(res["ppl"], math.exp(nll / n), rel_tol=1e-9)
    assert eval_windows(tokens, 16, 2).shape == (2, 16)


def test_perplexity_runs_without_a_kv_cache(llama_dir):
    """HF models are scored with use_cache=False; a bare module without a config gets no flag."""
    from types import SimpleNamespace

    model, _ = load_model(llama_dir, dtype="float64")
    seen, forward = [], model.forward

    def spy(*a, **kw):
        seen.append(kw.get("use_cache", "absent"))
        return forward(*a, **kw)

    model.forward = spy
    windows = eval_windows(torch.arange(40) % 300, 8, None)
    ref = perplexity(model, windows, batch_size=2, progress=False)
    assert seen == [False] * 3

    class Bare(torch.nn.Module):  # logits of the wrapped model, forward(input_ids) only
        def __init__(self):
            super().__init__()
            self.inner = model

        def forward(self, input_ids):
            return SimpleNamespace(logits=forward(input_ids=input_ids).logits)

    assert perplexity(Bare(), windows, batch_size=2, progress=False)["ppl"] == pytest.approx(ref["ppl"], rel=1e-12)


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16])
def test_summed_nll_is_chunked_and_exact(dtype, monkeypatch):
    """The loss sees at most chunk_tokens positions at a time, in float32, and sums to the
    whole-block cross-entropy of the same (upcast) logits."""
    import torch.nn.functional as F

    g = torch.Generator().manual_seed(0)
    b, T, V = 3, 11, 37
    logits = (3 * torch.randn(b, T, V, generator=g, dtype=torch.float64)).to(dtype)
    ids = torch.randint(0, V, (b, T), generator=g)
    ref = F.cross_entropy(logits[:, :-1].double().reshape(-1, V), ids[:, 1:].reshape(-1), reduction="sum")
    seen = []
    ce = F.cross_entropy

    def spy(x, y, **kw):
        seen.append((x.shape[0], x.dtype))
        return ce(x, y, **kw)

    monkeypatch.setattr(F, "cross_entropy", spy)
    for chunk in (1, 4, 10, 1024):
        seen.clear()
        got = summed_nll(logits, ids, chunk_tokens=chunk)
        assert got.dtype == torch.float64
        assert float(got) == pytest.approx(float(ref), rel=1e-6 if dtype == torch.bfloat16 else 1e-12)
        assert sum(n for n, _ in seen) == b * (T - 1)
        assert max(n for n, _ in seen) == min(chunk, T - 1)
        assert {dt for _, dt in seen} == {torch.float32 if dtype == torch.bfloat16 else torch.float64}
    with pytest.raises(ValueError, match="chunk_tokens"):
        summed_nll(logits, ids, chunk_tokens=0)


def test_sample_windows_deterministic():
    tokens = torch.arange(1000)
    a, b = sample_windows(tokens, 5, 64, 0), sample_windows(tokens, 5, 64, 0)
    assert torch.equal(a, b) and a.shape == (5, 64)
    assert not torch.equal(a, sample_windows(tokens, 5, 64, 1))
    assert all(torch.equal(w, torch.arange(w[0], w[0] + 64)) for w in a)  # contiguous windows


# ----------------------------------------------------------------------------- bad input
def test_bad_models(tmp_path):
    from transformers import AutoConfig

    with pytest.raises(ModelError, match="gpt2"):
        check_family(AutoConfig.for_model("gpt2"))
    with pytest.raises(ModelError, match="not divisible"):
        attention_shape(tiny_config("llama", num_attention_heads=4, num_key_value_heads=3))
    with pytest.raises(ModelError, match="does not exist"):
        load_model("./no/such/dir")


def test_per_layer_widths_run_in_memory(llama_dir):
    """FLAP's adaptive structure gives per-layer widths: the config is left alone, the model
    still equals zeroing the pruned columns, and saving is refused with a clear error."""
    ids = _ids()
    model, _ = load_model(llama_dir, dtype="float64")
    ref, _ = load_model(llama_dir, dtype="float64")
    geom = attention_shape(model.config)
    keep = {
        "layers": [
            {"kv_groups": [1], "channels": list(range(40))},
            {"kv_groups": [0, 1], "channels": list(range(0, 48, 2))},
        ]
    }
    prune_model_(model, keep)
    with torch.no_grad():
        ref.model.layers[0].self_attn.o_proj.weight[:, o_proj_columns([0], geom)] = 0
        ref.model.layers[0].mlp.down_proj.weight[:, 40:] = 0
        ref.model.layers[1].mlp.down_proj.weight[:, 1::2] = 0
    torch.testing.assert_close(_logits(model, ids), _logits(ref, ids), rtol=1e-10, atol=1e-10)
    with pytest.raises(ModelError, match="per-layer widths differ"):
        rewrite_config_(model)


def test_hub_dataset_path_with_local_files(tmp_path):
    """The `hub` source goes through datasets.load_dataset (WikiText-2 on a cluster); here the
    `text` builder reads local files, so the same code path runs offline."""
    from coec.data.text import load_split

    (tmp_path / "train.txt").write_text("alpha beta\ngamma\n")
    (tmp_path / "test.txt").write_text("delta\nepsilon\n")
    spec = {
        "source": "hub",
        "path": "text",
        "calib_split": "train",
        "eval_split": "test",
        "data_files": {"train": str(tmp_path / "train.txt"), "test": str(tmp_path / "test.txt")},
    }
    assert load_split(spec, "calib") == "alpha beta\n\ngamma"
    assert load_split(spec, "eval") == "delta\n\nepsilon"
