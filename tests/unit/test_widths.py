"""Aligned MLP widths (config ``channel_multiple`` / ``channel_rounding``, coec.select.widths): the
rounding, multiple 1 as the paper's rule exactly, the top of the score kept, refusals, the
zero and keep-everything cases, the config and the select job's arguments."""

import copy
import math

import pytest
import torch

from coec.calibrate.layer_pass import GramAccumulator, gram_tensors
from coec.config.validate import SCHEMA, ConfigError, schema_default, validate_config
from coec.model.arch import AttnShape
from coec.select.scores import (
    KeepRule,
    aligned_keep,
    aligned_steps,
    check_multiple,
    layer_scores,
    n_keep,
    select_layer,
    selection_registry,
    top_k_sorted,
)
from coec.select.widths import PAPER_WIDTH, WIDTH_KEYS, selection_width, width_args, width_note, width_record


@pytest.mark.parametrize(
    "ratio, ceil, nearest, floor",
    [
        (0.1, 1536, 1280, 1280),  # 1382.4 channels: ceil keeps all (logged)
        (0.2, 1280, 1280, 1024),  # 1228.8
        (0.3, 1280, 1024, 1024),  # 1075.2: the 30 % cell's 1,076 channels cut to 1,024
        (0.5, 768, 768, 768),  # exact
    ],
)
def test_rounding_to_256(ratio, ceil, nearest, floor):
    n = 1536  # SmolLM2-135M's d_ff
    assert [aligned_keep(n, ratio, 256, r) for r in ("ceil", "nearest", "floor")] == [ceil, nearest, floor]


def test_rounding_small_multiples_and_ties():
    # 0.625 x 64 = 40 channels = 2.5 steps of 16: a tie keeps fewer (nearest prunes half up)
    assert aligned_keep(64, 0.375, 16, "ceil") == 48
    assert aligned_keep(64, 0.375, 16, "nearest") == 32
    assert aligned_keep(64, 0.375, 16, "floor") == 32
    assert aligned_keep(64, 0.3, 16, "nearest") == 48  # 44.8 = 2.8 steps
    assert aligned_keep(48, 0.3, 8, "ceil") == 40  # 33.6 channels
    assert aligned_keep(48, 0.3, 8, "floor") == 32
    for m in (8, 16, 32):
        for r in ("ceil", "nearest", "floor"):
            for ratio in (0.1, 0.25, 0.3, 0.5, 0.7):
                k = aligned_keep(96, ratio, m, r)
                assert k % m == 0 and 0 < k <= 96, (m, r, ratio, k)


def _old_n_keep(n, ratio, rounding):
    """The selection's count before aligned widths existed (ceil or nearest)."""
    if rounding == "ceil":
        k = math.ceil((1.0 - ratio) * n - 1e-9)
    else:
        k = n - math.floor(ratio * n + 0.5 + 1e-9)
    return max(1, min(n, k))


def test_multiple_one_is_the_old_rule():
    for n in (3, 7, 48, 1536, 8192, 14336):
        for ratio in (0.05, 0.1, 0.2, 0.25, 0.3, 1 / 3, 0.5, 0.7, 0.95):
            for r in ("ceil", "nearest"):
                assert aligned_keep(n, ratio, 1, r) == _old_n_keep(n, ratio, r) == n_keep(n, ratio, r)
            assert aligned_keep(n, ratio, 1, "floor") == max(1, math.floor((1 - ratio) * n + 1e-9))


def _layer_problem(d_ff=48, seed=0):
    g = torch.Generator().manual_seed(seed)
    geom = AttnShape(n_heads=4, n_kv=2, head_dim=8)
    ow, dw = torch.randn(32, 32, generator=g), torch.randn(32, d_ff, generator=g)
    stats = []
    for d in (32, d_ff):
        acc = GramAccumulator(d, torch.device("cpu"))
        acc.update(torch.randn(64, d, generator=g) * torch.rand(d, generator=g) * 3 + 0.5)
        st = {k.split(".")[1]: v for k, v in gram_tensors({"m": acc}, torch.float64).items()}
        st["count"] = int(st["count"][0])
        stats.append(st)
    return ow, stats[0], dw, stats[1], geom


@pytest.mark.parametrize("method", ["wanda_sp", "flap", "rcpu"])
def test_select_layer_keeps_the_top_of_the_score(method):
    ow, ost, dw, dst, geom = _layer_problem()
    W, S = {"o_proj": ow, "down_proj": dw}, {"o_proj": ost, "down_proj": dst}
    scores = layer_scores(method, W, S, geom)["down_proj"]
    base = select_layer(method, W, S, geom, KeepRule(0.3))
    assert base == select_layer(method, W, S, geom, KeepRule(0.3, channel_multiple=1, channel_rounding="ceil"))
    assert base["channels"] == top_k_sorted(scores, 34)  # ceil(0.7 x 48)
    for m, r, k in ((8, "ceil", 40), (8, "floor", 32), (16, "nearest", 32), (16, "ceil", 48)):
        got = select_layer(method, W, S, geom, KeepRule(0.3, channel_rounding=r, channel_multiple=m))
        assert got["kv_groups"] == base["kv_groups"]  # attention: whole KV groups, untouched
        assert got["channels"] == top_k_sorted(scores, k)
        pruned = sorted(set(range(48)) - set(got["channels"]))
        if pruned:
            assert scores[got["channels"]].min() >= scores[pruned].max()


def test_refusals():
    with pytest.raises(ValueError, match=r"^channel_multiple 64 is larger than the MLP width d_ff = 48$"):
        check_multiple(48, 64)
    with pytest.raises(ValueError, match="channel_multiple 64 .* d_ff = 48"):
        aligned_keep(48, 0.3, 64, "floor")
    for bad in (0, -8, 2.5, True):
        with pytest.raises(ValueError, match="positive integer"):
            check_multiple(48, bad)
    with pytest.raises(ValueError, match="channel_rounding 'up'"):
        aligned_keep(48, 0.3, 8, "up")
    check_multiple(48, 48)  # the whole width is a multiple


def test_zero_keeps_one_multiple_and_past_the_width_keeps_all():
    width = (16, "floor")
    assert aligned_steps(48, 0.9, *width) == 0  # 4.8 channels
    assert aligned_keep(48, 0.9, *width) == 16
    assert "to 0: keeping one multiple, 16 channels" in width_note(48, 16, 0, 0.9, width)
    assert aligned_keep(1536, 0.1, 256, "ceil") == 1536
    note = width_note(1536, 1536, 6, 0.1, (256, "ceil"))
    assert "keeps all 1536 MLP channels" in note and "1382.4" in note
    assert aligned_keep(1000, 0.1, 256, "ceil") == 1000  # 1,024 > 1,000: capped at the width
    assert width_note(1536, 1024, 4, 0.3, (256, "floor")) is None


def test_width_record():
    layers = [{"kv_groups": [0], "channels": list(range(32))}, {"kv_groups": [1], "channels": list(range(16))}]
    fields, out = width_record(layers, 48, PAPER_WIDTH)
    assert fields == {} and out is layers
    fields, out = width_record(layers, 48, (16, "floor"))
    assert fields == {"channel_multiple": 16, "channel_rounding": "floor", "realised_channel_ratio": 0.5}
    assert [k["realised_channel_ratio"] for k in out] == [16 / 48, 32 / 48]
    assert [list(k)[:2] for k in out] == [["kv_groups", "channels"]] * 2
    assert "realised_channel_ratio" not in layers[0]  # the input is left alone


def _config():
    from pathlib import Path

    import yaml

    return yaml.safe_load((Path(__file__).parents[2] / "config.yaml").read_text())


def test_schema_defaults_are_the_papers_rule():
    assert tuple(schema_default(k) for k in WIDTH_KEYS) == PAPER_WIDTH


def test_config_widths_and_select_arguments():
    cfg = _config()
    cfg.pop("table_sota")  # its rows name config.yaml's own selections
    cfg["frontier"]["rows"] = [r for r in cfg["frontier"]["rows"] if not r["selection"].startswith("search-")]
    cfg["selections"] = {
        "rcpu-a256": {"score": "rcpu", "channel_multiple": 256, "channel_rounding": "floor"},
        "flap-a32": {"score": "flap", "group_aggregation": "sum_squared", "channel_multiple": 32},
    }
    cfg = validate_config(copy.deepcopy(cfg), SCHEMA)
    assert selection_width(cfg, "rcpu") == PAPER_WIDTH
    assert selection_width(cfg, "rcpu-a256") == (256, "floor")
    assert selection_width(cfg, "flap-a32") == (32, "ceil")  # rounding from the top level
    assert width_args(selection_width(cfg, "rcpu")) == ""
    assert width_args((256, "floor")) == "--channel-multiple 256 --channel-rounding floor"
    reg = selection_registry(cfg["selections"])
    assert reg["rcpu-a256"] == reg["rcpu"]  # the same score; the width is not a score option
    assert reg["flap-a32"].options() == {"group_aggregation": "sum_squared"}
    top = dict(cfg, channel_multiple=64, channel_rounding="nearest")
    assert selection_width(top, "rcpu") == (64, "nearest")
    assert selection_width(top, "rcpu-a256") == (256, "floor")


def test_config_width_errors():
    cfg = _config()
    with pytest.raises(ValueError, match="cannot be redefined"):
        selection_registry({"rcpu": {"score": "rcpu", "channel_multiple": 256}})
    for key, val in (("channel_multiple", 0), ("channel_multiple", 2.5), ("channel_rounding", "up")):
        bad = copy.deepcopy(cfg)
        bad[key] = val
        with pytest.raises(ConfigError, match=key):
            validate_config(bad, SCHEMA)
        bad = copy.deepcopy(cfg)
        bad["selections"] = {"rcpu-a": {"score": "rcpu", key: val}}
        with pytest.raises(ConfigError, match=key):
            validate_config(bad, SCHEMA)
