"""coec.select.search.budget (and coec.export.gguf.mix): the levels of a width search, the prunable
parameters and GGUF bytes of a level, the budget and its refusals."""

from __future__ import annotations

import pytest

from coec.export.gguf.mix import Place, kquant_type, use_more_bits
from coec.iterative.state import unit_params
from coec.model.arch import AttnShape
from coec.report.cost import PUBLISHED_ARCHS, count_params, pruned_shape
from coec.select.scores import KeepRule, aligned_keep, n_keep
from coec.select.search.budget import (
    build_space,
    channel_levels,
    check_level,
    kv_levels,
    model_bytes,
    parse_budget,
    prunable_params,
    uniform_pairs,
)


def config(model_type="llama", **over):
    cfg = {
        "model_type": model_type,
        "hidden_size": 256,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 64,
        "intermediate_size": 512,
        "num_hidden_layers": 2,
        "vocab_size": 1000,
        "tie_word_embeddings": False,
    }
    return cfg | over


# ----------------------------------------------------------------------------- levels
def test_levels_are_multiples_of_the_channel_multiple_and_the_dense_width():
    assert kv_levels(4) == (1, 2, 3, 4) and kv_levels(4, allow_removal=True) == (0, 1, 2, 3, 4)
    assert channel_levels(100, 32) == (32, 64, 96, 100)  # 100 itself: the dense width
    assert channel_levels(96, 32, allow_removal=True) == (0, 32, 64, 96)
    assert channel_levels(5, 1) == (1, 2, 3, 4, 5)
    for m in (1, 8, 32, 128):
        space = build_space(config(intermediate_size=200), KeepRule(0.4, channel_multiple=m))
        for u in space.units:
            if u.kind == "channels":
                assert all(v % m == 0 or v == 200 for v in u.levels) and u.levels[-1] == 200
                for v in u.levels:
                    check_level(v, 200, m)


def test_a_level_off_the_multiple_is_refused_naming_the_key():
    with pytest.raises(ValueError, match=r"^channel_multiple: 100 kept channels is not a multiple of 32"):
        check_level(100, 512, 32)
    with pytest.raises(ValueError, match=r"^search\.allow_removal"):
        check_level(0, 512, 32)
    check_level(0, 512, 32, allow_removal=True)
    check_level(512, 512, 1000 // 2)  # the dense width is always a level
    with pytest.raises(ValueError, match="channel_multiple"):
        channel_levels(64, 128)  # a multiple wider than the MLP
    space = build_space(config(), KeepRule(0.5, channel_multiple=64))
    with pytest.raises(
        ValueError, match=r"^channel_multiple: layer 0 channels: 100 is not one of its levels 64, 128, \.\.\., 512"
    ):
        space.state_of([2, 100, 2, 128])
    assert space.values(space.state_of([2, 128, 1, 512])) == (2, 128, 1, 512)


# ----------------------------------------------------------------------------- parameters
@pytest.mark.parametrize("family", ["llama", "mistral", "qwen2", "qwen3", "granite"])
def test_prunable_params_of_a_group_and_a_channel(family):
    cfg = config(family)
    from coec.report.cost import arch_dims

    d = arch_dims(cfg)
    wg, wc = unit_params(AttnShape(4, 2, 64), 256)  # 2 hd (g + 1) d, 3 d: iterative AL-AM's weights
    bias = 2 * 64 + 2 * 64 if family == "qwen2" else 0  # Qwen2's q/k/v biases of a group (g hd + 2 hd)
    assert prunable_params(d, "kv_groups", 1) == wg + bias and prunable_params(d, "kv_groups", 2) == 2 * (wg + bias)
    assert prunable_params(d, "channels", 7) == 7 * wc and prunable_params(d, "channels", 0) == 0


@pytest.mark.parametrize("name", ["Llama-3.1-8B", "Qwen2.5-7B", "Qwen3-8B", "Llama-2-7B"])
def test_the_default_budget_is_the_uniform_cell_and_agrees_with_the_cost_table(name):
    cfg = PUBLISHED_ARCHS[name]
    spaces = {r: build_space(cfg, KeepRule(r)) for r in (0.2, 0.5)}
    for r, space in spaces.items():
        kv, ch = n_keep(cfg["num_key_value_heads"], r), aligned_keep(cfg["intermediate_size"], r)
        assert space.cost(space.uniform) == space.budget
        assert all(w == {"kv_groups": kv, "channels": ch} for w in space.widths(space.uniform))
    # the uniform cells' budgets differ by what the analytic count (Table 4) says they differ
    counts = {r: count_params(cfg, pruned_shape(cfg, r)) for r in spaces}
    assert spaces[0.2].budget - spaces[0.5].budget == counts[0.2] - counts[0.5]


def test_the_default_budget_rounds_as_the_uniform_selection():
    rule = KeepRule(0.3, group_rounding="nearest", channel_rounding="floor", channel_multiple=64)
    space = build_space(config(num_key_value_heads=4, num_attention_heads=8, head_dim=32), rule)
    kv, ch = n_keep(4, 0.3, "nearest"), aligned_keep(512, 0.3, 64, "floor")
    assert (kv, ch) == (3, 320) and space.widths(space.uniform) == [{"kv_groups": 3, "channels": 320}] * 2


# ----------------------------------------------------------------------------- bytes
def test_byte_budget_matches_a_hand_count_q8_0():
    widths = [{"kv_groups": 1, "channels": 100}, {"kv_groups": 2, "channels": 512}]
    q8 = lambda rows, width: rows * width // 32 * 34  # noqa: E731  q8_0: 34 bytes per 32 values
    f16 = lambda rows, width: rows * width * 2  # noqa: E731
    top = q8(1000, 256) * 2 + 256 * 4  # token_embd, output (untied), output_norm (f32)
    layer0 = q8(128, 256) + 2 * q8(64, 256) + q8(256, 128)  # q (2 heads), k, v, o: one group
    layer0 += 2 * q8(100, 256) + f16(256, 100)  # gate, up; down: 100 is no multiple of 32 -> f16
    layer1 = q8(256, 256) + 2 * q8(128, 256) + q8(256, 256) + 2 * q8(512, 256) + q8(256, 512)
    norms = 2 * 2 * 256 * 4
    assert model_bytes(config(), widths, "q8_0") == top + layer0 + layer1 + norms == 1_385_856


def test_byte_budget_matches_a_hand_count_q4_k_m():
    """Layer 1 of 2 is a use_more_bits block (attn_v, ffn_down in Q6_K); row widths 128 and 224
    (no multiple of 256) fall back to Q5_0, or Q8_0 from Q6_K."""
    widths = [{"kv_groups": 1, "channels": 224}, {"kv_groups": 2, "channels": 512}]
    q4k, q6k = (lambda rows, width, size=s: rows * width // 256 * size for s in (144, 210))
    q5_0, q8_0 = (lambda rows, width, size=s: rows * width // 32 * size for s in (22, 34))
    top = q4k(1000, 256) + q6k(1000, 256) + 256 * 4  # token_embd main type, output Q6_K, norm
    layer0 = q4k(128, 256) + q4k(64, 256) + q4k(64, 256) + q5_0(256, 128)  # o: 128 wide -> Q5_0
    layer0 += q4k(224, 256) * 2 + q5_0(256, 224)  # down: 224 wide -> Q5_0
    layer1 = q4k(256, 256) + q4k(128, 256) + q6k(128, 256) + q4k(256, 256)  # attn_v Q6_K
    layer1 += q4k(512, 256) * 2 + q6k(256, 512)  # ffn_down Q6_K
    norms = 2 * 2 * 256 * 4
    assert model_bytes(config(), widths, "q4_k_m") == top + layer0 + layer1 + norms == 896_464
    # tied embeddings: no output.weight, and token_embd takes the output's Q6_K
    assert model_bytes(config(tie_word_embeddings=True), widths, "q4_k_m") == 896_464 - q4k(1000, 256)
    # a layer with no attention weights moves the attn_v position rule (llama.cpp's counters)
    gone = [{"kv_groups": 0, "channels": 224}, {"kv_groups": 2, "channels": 512}]
    attn0 = q4k(128, 256) + q4k(64, 256) + q4k(64, 256) + q5_0(256, 128)
    # one attn_v left: index 0 of 1 is a use_more_bits block (0 >= 7 * 1 // 8)
    assert model_bytes(config(), gone, "q4_k_m") == 896_464 - attn0
    assert q8_0(1, 32) == 34


def test_k_quant_mix_rules():
    assert [i for i in range(9) if use_more_bits(i, 9)] == [0, 3, 6, 7, 8]
    assert [i for i in range(32) if use_more_bits(i, 32)] == [0, 1, 2, 3, 6, 9, 12, 15, 18, 21, 24, 27, 28, 29, 30, 31]
    name = lambda role, width, t="q4_k_m", **p: kquant_type(role, width, t, Place(**p)).name  # noqa: E731
    assert name("attn_q", 4096) == "Q4_K" and name("attn_v", 4096, index=0, count=32) == "Q6_K"
    assert (
        name("attn_v", 4096, index=4, count=32) == "Q4_K"
        and name("attn_v", 4096, index=11, count=80, big=True) == "Q5_K"
    )
    assert name("ffn_down", 14336, index=31, count=32) == "Q6_K" and name("ffn_down", 100, index=31, count=32) == "F16"
    assert name("attn_output", 96) == "Q5_0" and name("attn_output", 96, "q5_k_m") == "Q5_1"
    assert name("output", 4096) == "Q6_K" and name("output", 4000) == "Q8_0" and name("token_embd", 4096) == "Q4_K"
    assert name("token_embd", 4096, tied=True) == "Q6_K" and name("attn_v", 4096, "q6_k", index=5, count=32) == "Q6_K"


@pytest.mark.parametrize("gguf_type", ["q4_k_m", "q5_k_m", "q6_k", "q8_0", "q4_0", "f16"])
def test_byte_costs_add_up_to_the_file_for_every_allocation(gguf_type):
    cfg = config(num_hidden_layers=9, intermediate_size=768)
    dense = model_bytes(cfg, [{"kv_groups": 2, "channels": 768}] * 9, gguf_type)
    space = build_space(cfg, KeepRule(0.5, channel_multiple=32), {"bytes": dense * 4 // 5, "type": gguf_type})
    assert space.measure == "bytes" and space.fixed > 0
    for k, c in [(1, 32), (2, 224), (1, 768), (2, 256)]:
        state = space.state_of([k, c] * 9)
        assert space.fixed + space.cost(state) == model_bytes(cfg, space.widths(state), gguf_type)


def test_byte_budget_uniform_is_the_largest_uniform_that_fits():
    cfg = config(num_hidden_layers=4, intermediate_size=768)
    rule = KeepRule(0.5, channel_multiple=32)
    n = model_bytes(cfg, [{"kv_groups": 2, "channels": 768}] * 4, "q4_k_m") * 3 // 4
    space = build_space(cfg, rule, {"bytes": n, "type": "q4_k_m"})
    assert space.budget == n - space.fixed and space.cost(space.uniform) <= space.budget
    w = space.widths(space.uniform)
    assert all(x == w[0] for x in w)
    from coec.report.cost import arch_dims

    fits = [
        model_bytes(cfg, [{"kv_groups": k, "channels": c}] * 4, "q4_k_m")
        for k, c in uniform_pairs(arch_dims(cfg), rule)
    ]
    assert space.fixed + space.cost(space.uniform) == max(b for b in fits if b <= n)
    assert w[0] != {"kv_groups": 2, "channels": 768}


@pytest.mark.parametrize(("kv", "ffn", "multiple"), [(8, 200, 32), (4, 768, 32), (3, 100, 1), (5, 1000, 64)])
@pytest.mark.parametrize("rounding", ["ceil", "nearest", "floor"])
def test_uniform_pairs_are_every_width_the_uniform_selection_gives(kv, ffn, multiple, rounding):
    from coec.report.cost import arch_dims

    d = arch_dims(config(num_key_value_heads=kv, num_attention_heads=kv, intermediate_size=ffn))
    group_rounding = "ceil" if rounding == "floor" else rounding
    rule = KeepRule(0.5, group_rounding=group_rounding, channel_rounding=rounding, channel_multiple=multiple)
    grid = {
        (n_keep(kv, r, group_rounding), aligned_keep(ffn, r, multiple, rounding))
        for r in (i / 20011 for i in range(1, 20011))
    }
    assert grid <= uniform_pairs(d, rule)


# ----------------------------------------------------------------------------- refusals
@pytest.mark.parametrize(
    ("budget", "match"),
    [
        ({"bytes": 1000, "type": "q4_k_m"}, r"^search\.budget\.bytes: 1000 bytes cannot be met: the smallest"),
        ({"bytes": 10**9, "type": "q4_k_m"}, r"^search\.budget\.bytes: .* hold the dense model .*nothing to prune"),
        ({"params": 10}, r"^search\.budget\.params: 10 params cannot be met"),
        ({"bytes": 10**6}, r"^search\.budget\.type: unknown GGUF tensor type 'None'"),
        ({"bytes": 10**6, "type": "q3_k"}, r"^search\.budget\.type: unknown GGUF tensor type 'q3_k'"),
        ({"bytes": 10**6, "type": "q3_k_m"}, r"^search\.budget\.type: the bytes of a q3_k_m file are not modelled"),
        ({"bytes": -5, "type": "q8_0"}, r"^search\.budget\.bytes must be a positive integer"),
        ({"params": 1.5e6}, r"^search\.budget\.params must be a positive integer"),
        ({"params": 10**6, "type": "q8_0"}, r"^search\.budget\.type: a params budget has no GGUF type"),
        ({"ratio": 0.5}, r"^search\.budget: unknown key 'ratio'"),
        ({"params": 1, "bytes": 1}, r"^search\.budget: give exactly one of params, bytes"),
    ],
)
def test_a_budget_no_allocation_meets_is_refused_naming_the_key(budget, match):
    with pytest.raises(ValueError, match=match):
        build_space(config(), KeepRule(0.5), budget)


def test_a_byte_budget_with_block_removal_goes_lower():
    tight = {"bytes": 700_000, "type": "q8_0"}  # below every layer's smallest widths, above the fixed part
    with pytest.raises(ValueError, match="cannot be met"):
        build_space(config(), KeepRule(0.5), tight)
    space = build_space(config(), KeepRule(0.5), tight, allow_removal=True)
    assert space.lowest() == 0 and space.cost(space.uniform) <= space.budget
    assert parse_budget(None)[1] is None
