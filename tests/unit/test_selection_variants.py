"""Selection-score variants (coec.select.scores.ScoreSpec, config `selections`): closed forms on a tiny
problem, the paper defaults unchanged bit for bit, the config registry and the Gram's Σ|x|."""

import copy

import pytest
import torch

from coec.calibrate.layer_pass import GramAccumulator, gram_tensors
from coec.config.validate import SCHEMA, ConfigError, validate_config
from coec.model.arch import AttnShape
from coec.select.scores import (
    KeepRule,
    ScoreSpec,
    column_scores,
    group_scores,
    select_layer,
    selection_registry,
    selection_spec,
    top_k_sorted,
)

# a tiny problem: W (2 x 2), three tokens of two channels
W = torch.tensor([[3.0, -1.0], [4.0, 2.0]], dtype=torch.float64)
X = torch.tensor([[1.0, -2.0], [3.0, 0.0], [-1.0, 2.0]], dtype=torch.float64)
GD, TOT, N, ABS = (X * X).sum(0), X.sum(0), 3, X.abs().sum(0)
L2W = torch.tensor([5.0, 5.0**0.5], dtype=torch.float64)  # ||W[:, j]||
L1W = torch.tensor([3.5, 1.5], dtype=torch.float64)  # mean_i |W_ij|
L2X = torch.tensor([11.0**0.5, 8.0**0.5], dtype=torch.float64)  # sqrt(Σx²)
ABX = torch.tensor([5.0 / 3, 4.0 / 3], dtype=torch.float64)  # E|x|
VAR = torch.tensor([4.0, 4.0], dtype=torch.float64)  # unbiased: (11-3)/2, (8-0)/2


@pytest.mark.parametrize(
    "spec, want",
    [
        ("wanda_sp", L2W * L2X),
        ({"score": "wanda_sp", "weight_norm": "l1_mean"}, L1W * L2X),
        ({"score": "wanda_sp", "activation_scale": "abs_mean"}, L2W * ABX),
        ("flap", VAR * L2W**2),
        ({"score": "flap", "weight_norm": "l1_mean"}, VAR * L1W**2),
        ("rcpu", L2W * L2X * VAR),
        ({"score": "rcpu", "activation_scale": "abs_mean"}, L2W * ABX * VAR),
        ({"score": "rcpu", "weight_norm": "l1_mean", "activation_scale": "abs_mean"}, L1W * ABX * VAR),
    ],
)
def test_column_score_closed_forms(spec, want):
    got = column_scores(selection_spec(spec), W, GD, TOT, N, ABS)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=0)


def test_group_aggregation_closed_form():
    geom = AttnShape(n_heads=2, n_kv=2, head_dim=2)
    s = torch.tensor([1.0, 2.0, 3.0, 0.5], dtype=torch.float64)
    torch.testing.assert_close(group_scores(s, geom), torch.tensor([3.0, 3.5], dtype=torch.float64))
    torch.testing.assert_close(group_scores(s, geom, "sum_squared"), torch.tensor([5.0, 9.25], dtype=torch.float64))
    # the two aggregations keep different groups here
    assert top_k_sorted(group_scores(s, geom), 1) == [1]
    assert top_k_sorted(group_scores(s, geom, "sum_squared"), 1) == [1]
    s2 = torch.tensor([2.0, 2.0, 3.9, 0.0], dtype=torch.float64)
    assert top_k_sorted(group_scores(s2, geom), 1) == [0]
    assert top_k_sorted(group_scores(s2, geom, "sum_squared"), 1) == [1]


def test_abs_mean_needs_abssum():
    with pytest.raises(ValueError, match="abssum"):
        column_scores(selection_spec({"score": "rcpu", "activation_scale": "abs_mean"}), W, GD, TOT, N)


def _old_scores(method, weight, gd, total, count):
    """The paper formulas as select.column_scores computed them before variants existed."""
    w = weight.double().norm(dim=0)
    x = gd.double().clamp_min(0.0).sqrt()
    mean = total.double() / count
    var = ((gd.double() - count * mean**2) / max(count - 1, 1)).clamp_min(0.0)
    return {"wanda_sp": w * x, "flap": var * w**2, "rcpu": w * x * var}[method]


@pytest.mark.parametrize("method", ["wanda_sp", "flap", "rcpu"])
def test_paper_defaults_bit_for_bit(method):
    g = torch.Generator().manual_seed(0)
    geom = AttnShape(n_heads=6, n_kv=3, head_dim=4)
    ow, dw = torch.randn(16, 24, generator=g), torch.randn(16, 40, generator=g)
    stats = []
    for d in (24, 40):
        acc = GramAccumulator(d, torch.device("cpu"))
        acc.update(torch.randn(50, d, generator=g) * torch.rand(d, generator=g) * 3 + 0.5)
        stats.append({k.split(".")[1]: v for k, v in gram_tensors({"m": acc}, torch.float64).items()})
    for st in stats:
        st["count"] = int(st["count"][0])
    for name, spec in ((method, method), (method, ScoreSpec(method)), (method, {"score": method})):
        new = column_scores(spec, ow, stats[0]["sumsq"], stats[0]["sum"], stats[0]["count"])
        assert torch.equal(new, _old_scores(name, ow, stats[0]["sumsq"], stats[0]["sum"], stats[0]["count"]))
        W, S = {"o_proj": ow, "down_proj": dw}, dict(zip(("o_proj", "down_proj"), stats, strict=True))
        keep = select_layer(spec, W, S, geom, KeepRule(0.3, "nearest"))
        og = _old_scores(name, ow, stats[0]["sumsq"], stats[0]["sum"], stats[0]["count"]).view(3, 8).sum(1)
        od = _old_scores(name, dw, stats[1]["sumsq"], stats[1]["sum"], stats[1]["count"])
        assert keep == {"kv_groups": top_k_sorted(og, 2), "channels": top_k_sorted(od, 28)}


def test_gram_abssum_roundtrip(tmp_path):
    from coec.io.artifacts import gram_path, read_gram_layer, write_gram_layer

    acc = GramAccumulator(3, torch.device("cpu"))
    x = torch.randn(7, 3)
    acc.update(x)
    t = gram_tensors({"o_proj": acc})
    write_gram_layer(gram_path(tmp_path, 0), t)
    st = read_gram_layer(tmp_path, 0, "o_proj")
    torch.testing.assert_close(st["abssum"], x.abs().sum(0).double())
    # an older file without the key still reads, without abssum
    del t["o_proj.abssum"]
    write_gram_layer(gram_path(tmp_path, 1), t)
    assert "abssum" not in read_gram_layer(tmp_path, 1, "o_proj")


def test_registry_and_spec_errors():
    reg = selection_registry(
        {"rcpu-absx": {"score": "rcpu", "activation_scale": "abs_mean"}, "flap": {"score": "flap"}}
    )
    assert set(reg) == {"wanda_sp", "flap", "rcpu", "obs", "rcpu-absx"}
    assert reg["rcpu"].options() == {} and reg["rcpu-absx"].options() == {"activation_scale": "abs_mean"}
    with pytest.raises(ValueError, match="cannot be redefined"):
        selection_registry({"flap": {"score": "flap", "group_aggregation": "sum_squared"}})
    with pytest.raises(ValueError, match="no .*X_j"):
        selection_spec({"score": "flap", "activation_scale": "abs_mean"})
    with pytest.raises(ValueError, match="weight_norm"):
        selection_spec({"score": "rcpu", "weight_norm": "l3"})
    with pytest.raises(ValueError, match="unknown selection score"):
        selection_spec("wanda")


def _config():
    from pathlib import Path

    import yaml

    return yaml.safe_load((Path(__file__).parents[2] / "config.yaml").read_text())


def test_config_selections_validated():
    cfg = _config()
    cfg["selections"] = {**cfg.get("selections", {}), "flap-sq": {"score": "flap", "group_aggregation": "sum_squared"}}
    cfg["table1"]["rows"].append({"selection": "flap-sq", "compensation": "none"})
    validate_config(copy.deepcopy(cfg), SCHEMA)
    bad = copy.deepcopy(cfg)
    bad["table1"]["rows"].append({"selection": "flap-cube", "compensation": "none"})
    with pytest.raises(ConfigError, match=r"table1\.rows\[\d+\]\.selection names unknown selection 'flap-cube'"):
        validate_config(bad, SCHEMA)
    bad = copy.deepcopy(cfg)
    bad["selections"]["../x"] = {"score": "flap"}
    with pytest.raises(ConfigError, match="bad name"):
        validate_config(bad, SCHEMA)
    bad = copy.deepcopy(cfg)
    bad["selections"]["flap-sq"]["group_aggregation"] = "max"
    with pytest.raises(ConfigError, match="group_aggregation"):
        validate_config(bad, SCHEMA)
