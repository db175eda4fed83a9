"""Fast tests of the deployment-cost arithmetic (src/coec/report/cost.py, paper Table 4)."""

import math
from fractions import Fraction

import pytest

from coec.report.cost import (
    PUBLISHED_ARCHS,
    cost_table,
    count_params,
    flops_per_token,
    kept_count,
    kv_cache_bytes,
    peak_memory_gb,
    pruned_shape,
)

QWEN7 = PUBLISHED_ARCHS["Qwen2.5-7B"]
LLAMA70 = PUBLISHED_ARCHS["Llama-3-70B"]

# Table 4 of the paper: (params dense, 30 %), (mem dense, 30 %), (GFLOPs/tok dense, 30 %)
TABLE4 = {
    "Qwen2.5-7B": ((7.62, 5.70), (15.0, 11.5), (15.2, 11.4)),
    "Llama-3-70B": ((70.6, 50.6), (132.5, 95.7), (141.1, 101.2)),
}


def test_table4_params_and_flops_as_printed():
    rows = {r["model"]: r for r in cost_table({k: PUBLISHED_ARCHS[k] for k in TABLE4}, 0.3)}
    qwen, llama = rows["Qwen2.5-7B"], rows["Llama-3-70B"]
    assert (round(qwen["params_dense_B"], 2), round(qwen["params_pruned_B"], 2)) == TABLE4["Qwen2.5-7B"][0]
    assert (round(llama["params_dense_B"], 1), round(llama["params_pruned_B"], 1)) == TABLE4["Llama-3-70B"][0]
    for name, r in rows.items():
        assert (round(r["gflops_dense"], 1), round(r["gflops_pruned"], 1)) == TABLE4[name][2]


def test_table4_memory_within_documented_deviation():
    for name, (_, mem, _) in TABLE4.items():
        cfg = PUBLISHED_ARCHS[name]
        got = (peak_memory_gb(cfg), peak_memory_gb(cfg, pruned_shape(cfg, 0.3)))
        for g, paper in zip(got, mem):
            assert abs(g - paper) / paper < 0.035, (name, g, paper)
        assert got[1] < got[0]


def test_known_public_param_counts():
    expected_b = {
        "Llama-3.1-8B": 8.03,
        "Qwen2.5-14B": 14.77,
        "Qwen2.5-32B": 32.76,
        "Qwen2.5-72B": 72.71,
        "Llama-2-7B": 6.74,
        "Llama-2-13B": 13.02,
        "Llama-2-70B": 68.98,
        "Qwen3-8B": 8.19,
        "Mistral-7B-v0.1": 7.24,
    }
    for name, b in expected_b.items():
        assert round(count_params(PUBLISHED_ARCHS[name]) / 1e9, 2) == b, name


def test_pruned_shapes_of_table4_models():
    assert pruned_shape(QWEN7, 0.3) == {
        "num_key_value_heads": 3,
        "num_attention_heads": 21,
        "head_dim": 128,
        "intermediate_size": 13261,
    }
    assert pruned_shape(LLAMA70, 0.3) == {
        "num_key_value_heads": 6,
        "num_attention_heads": 48,
        "head_dim": 128,
        "intermediate_size": 20071,
    }
    # Llama-2 config.json has no head_dim: it must come out explicit (hidden/heads changes)
    cfg = {k: v for k, v in PUBLISHED_ARCHS["Llama-2-7B"].items() if k != "head_dim"}
    assert pruned_shape(cfg, 0.3)["head_dim"] == 128
    assert pruned_shape(cfg, 0.3)["num_attention_heads"] == 23


def test_kept_count_float_edge_cases():
    assert (1 - 0.7) * 10 > 3  # the float error the rule must absorb
    assert kept_count(10, 0.7) == 3
    assert kept_count(10, 0.1) == 9
    assert kept_count(10, 0.9) == 1
    assert kept_count(3, 0.3, "ceil") == 3
    assert kept_count(3, 0.3, "nearest") == 2
    assert kept_count(4, 0.3, "ceil") == 3 and kept_count(4, 0.3, "nearest") == 3
    assert kept_count(2, 0.25, "nearest") == 1  # 0.5 pruned rounds half up
    assert kept_count(1, 0.9, "nearest") == 1  # never prunes everything
    for bad in (0.0, 1.0, -0.1, 1.5):
        with pytest.raises(ValueError):
            kept_count(10, bad)
    assert kept_count(10, 0.35, "floor") == 6  # channel_rounding's third rule (6.5 kept)
    with pytest.raises(ValueError):
        kept_count(10, 0.3, "up")


def test_kept_count_agrees_with_exact_rational_arithmetic():
    for pct in range(1, 100):
        ratio, exact = pct / 100, Fraction(pct, 100)
        for n in (*range(1, 65), 18944, 28672, 14336):
            assert kept_count(n, ratio) == max(1, math.ceil((1 - exact) * n)), (pct, n)
            pruned = math.floor(exact * n + Fraction(1, 2))
            assert kept_count(n, ratio, "nearest") == max(1, n - pruned), (pct, n)


def test_group_rounding_applies_to_kv_groups_only():
    cfg = dict(QWEN7, num_key_value_heads=3, num_attention_heads=21)
    assert pruned_shape(cfg, 0.3)["num_key_value_heads"] == 3
    s = pruned_shape(cfg, 0.3, group_rounding="nearest")
    assert (s["num_key_value_heads"], s["num_attention_heads"]) == (2, 14)
    assert s["intermediate_size"] == 13261


def test_tied_embeddings_counted_once_and_hf_config_accepted():
    from transformers import AutoConfig

    cfg = dict(QWEN7, tie_word_embeddings=True)
    assert count_params(QWEN7) - count_params(cfg) == 152064 * 3584
    hf = AutoConfig.for_model("qwen2", **{k: v for k, v in QWEN7.items() if k != "model_type"})
    assert count_params(hf) == count_params(QWEN7)


def test_flops_options_and_kv_cache():
    assert flops_per_token(QWEN7) == pytest.approx(2 * count_params(QWEN7) / 1e9)
    no_emb = flops_per_token(QWEN7, include_embedding=False)
    assert flops_per_token(QWEN7) - no_emb == pytest.approx(2 * 152064 * 3584 / 1e9)
    with_ctx = flops_per_token(QWEN7, context_len=4096)
    assert with_ctx - flops_per_token(QWEN7) == pytest.approx(4 * 28 * 28 * 128 * 4096 / 1e9)
    assert kv_cache_bytes(QWEN7, seq_len=1) == 2 * 28 * 4 * 128 * 2
    assert kv_cache_bytes(QWEN7, pruned_shape(QWEN7, 0.3), seq_len=1) == 2 * 28 * 3 * 128 * 2


def test_bad_configs_raise_clear_errors():
    with pytest.raises(ValueError, match="model_type"):
        count_params(dict(QWEN7, model_type="gpt2"))
    with pytest.raises(KeyError, match="intermediate_size"):
        count_params({k: v for k, v in QWEN7.items() if k != "intermediate_size"})
    with pytest.raises(ValueError, match="ratio"):
        pruned_shape(QWEN7, 1.0)
