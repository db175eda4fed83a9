"""Bad input gets one clear ValueError naming the problem; the API contract on good input."""

from __future__ import annotations

import json
from dataclasses import fields

import pytest
import torch

from coec.compensate import compensate
from coec.compensate.method import METHODS, Compensation
from conftest import method_kwargs
from test_compensate_method_problems import make_problem


@pytest.fixture(scope="module")
def prob():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield make_problem(12, 20, 14, 100)
    torch.set_num_threads(n)


def _bad(x, idx, val):
    x = x.clone()
    x[idx] = val
    return x


@pytest.mark.parametrize(
    "keep, match",
    [
        (torch.tensor([], dtype=torch.long), "keep is empty"),
        (torch.tensor([0, 3, 20]), "out of range"),
        (torch.tensor([-1, 3, 5]), "out of range"),
        (torch.tensor([3, 1, 5]), "sorted"),
        (torch.tensor([1, 3, 3, 5]), "duplicate"),
        (torch.tensor([[1, 3]]), "1-D"),
        (torch.tensor([1.0, 3.0]), "integer"),
    ],
)
def test_bad_keep(prob, keep, match):
    W0, G, mean, _, _ = prob
    with pytest.raises(ValueError, match=match):
        compensate(W0, G, mean, keep, "rcpu")


def test_bad_shapes_and_values(prob):
    W0, G, mean, keep, _ = prob
    cases = [
        ((W0[:, :-1], G, mean, keep, "none"), "gram shape"),
        ((W0, G[:-1], mean, keep, "none"), "gram shape"),
        ((W0, G, mean[:-1], keep, "none"), "mean has"),
        ((W0[0], G, mean, keep, "none"), "W0 must be 2-D"),
        ((_bad(W0, (0, 0), float("nan")), G, mean, keep, "coec"), "W0 contains NaN or Inf"),
        ((W0, _bad(G, (1, 2), float("inf")), mean, keep, "coec"), "gram contains NaN or Inf"),
        ((W0, _bad(G, (1, 2), float("nan")), mean, keep, "lstsq"), "gram contains NaN or Inf"),
        ((W0, G, _bad(mean, 0, float("nan")), keep, "bias"), "mean contains NaN or Inf"),
        ((W0, G, None, keep, "bias"), "requires mean"),
        ((W0, G.to(torch.int64), mean, keep, "none"), "floating-point"),
        ((W0, G, mean, keep, "ridge"), "unknown compensation method"),
        ((W0, G, mean, keep, "COEC"), "unknown compensation method"),
    ]
    for args, match in cases:
        with pytest.raises(ValueError, match=match):
            compensate(*args)


@pytest.mark.parametrize(
    "method, opts, match",
    [
        ("coec", {"alpah": 0.9}, "unknown option"),
        ("rcpu", {"alpha": 0.9}, "unknown option"),
        ("lstsq", {"max_rounds": 3}, "unknown option"),
        ("coec", {"alpha": 0.0}, "alpha"),
        ("coec", {"alpha": 1.5}, "alpha"),
        ("coec", {"rescale": "median"}, "rescale"),
        ("coec", {"right": "left"}, "right"),
        ("coec", {"align": "cosine"}, "align"),
        ("coec", {"tol_mode": "rel"}, "tol_mode"),
        ("coec", {"eta_scale": "auto"}, "eta_scale"),
        ("coec", {"eta": 0.0}, "eta"),
        ("coec", {"delta": -1.0}, "delta"),
        ("coec", {"delta_norm": "max"}, "delta_norm"),
        ("coec", {"kappa": 0.5}, "kappa"),
        ("coec", {"max_rounds": 2.5}, "max_rounds"),
        ("coec", {"max_rounds": -1}, "max_rounds"),
        ("coec", {"max_inner_steps": 0}, "max_inner_steps"),
        ("coec", {"gcv_grid": (1.0, 0.1, 10)}, "gcv_grid"),
        ("coec", {"gcv_grid": (1e-4, 1e5)}, "gcv_grid"),
        ("coec", {"anchor_rank": 0}, "anchor_rank"),
        ("coec", {"align_lambda": -1.0}, "align_lambda"),
        ("coec", {"align_lambda": 5.0}, "requires value_proj"),
        ("coec", {"inputs": {"value_proj": torch.zeros(13, 8, dtype=torch.float64)}}, "value_proj must have k"),
        (
            "coec",
            {"inputs": {"value_proj": torch.full((14, 8), float("nan"), dtype=torch.float64)}},
            "value_proj contains NaN",
        ),
        ("coec", {"inputs": {"value_proj": torch.randn(14, 8, dtype=torch.float64)}, "anchor_rank": 12}, "anchor_rank"),
        ("coec", {"psd_clip": 1}, "psd_clip"),
        ("coec", {"compute_dtype": "float16"}, "compute_dtype"),
        ("coec", {"left_polar": "newton"}, "left_polar"),
        ("coec", {"left_polar": "qr"}, "left_polar"),
        ("coec", {"setup_svd": "qr"}, "setup_svd"),
        ("coec", {"eta_scale": "lipschitz"}, "eta_scale"),
        ("coec", {"rg_update": "fresh"}, "rg_update"),
        ("coec", {"rg_refresh": -1}, "rg_refresh"),
        ("coec", {"rg_refresh": 2.5}, "rg_refresh"),
        ("lstsq", {"ridge": -1.0}, "ridge"),
        ("none", {"n_tokens": 0}, "n_tokens"),
    ],
)
def test_bad_options(prob, method, opts, match):
    W0, G, mean, keep, _ = prob
    with pytest.raises(ValueError, match=match):
        compensate(W0, G, mean, keep, method, **opts)


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_output_contract(prob, method, dtype):
    W0, G, mean, keep, _ = prob
    kw = method_kwargs(method, W0, G.float(), mean.float(), keep)
    out = compensate(W0.to(dtype), G.float(), mean.float(), keep.to(torch.int32), method, **kw)
    assert isinstance(out, Compensation)
    assert out.weight.shape == (12, 14) and out.weight.dtype == dtype and out.weight.device == W0.device
    assert (out.bias is not None) == (method in ("bias", "blend"))  # blend: the intercept
    if out.bias is not None:
        assert out.bias.shape == (12,) and out.bias.dtype == dtype
    s = json.dumps(out.info, allow_nan=False)
    assert "relerr_before" in s and "seconds" in s
    # keep as a plain list also works
    compensate(W0, G, mean, keep.tolist(), method, **kw)


def test_every_built_in_option_says_what_keeps_it():
    """docs/compensation-options.md's evidence column: a paper section, a default or a recorded result."""
    for name in ("none", "bias", "lstsq", "rcpu", "coec", "blend"):
        for f in fields(METHODS[name].options):
            assert f.metadata.get("evidence"), f"{name}.{f.name} has no evidence"
