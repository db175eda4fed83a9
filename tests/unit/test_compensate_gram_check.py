"""The calibration's Gram check (App. B's verdict and the output energy, formed once): a job that
reads it gives the bits of a job that forms them itself, runs neither the PSD check nor the
energy product again, and ignores a check of another Gram or another weight (saying so)."""

from __future__ import annotations

import json
import logging

import pytest
import torch

import coec.compensate.errors as errors
import coec.compensate.problem as method_module
from coec.compensate import compensate
from coec.compensate.gram_check import GramCheck
from coec.compensate.method import Problem, check_module, form_metric, prepare

METHODS = ("none", "bias", "lstsq", "rcpu")


def _problem(d_out=20, d_in=48, k=30, n=200, seed=0, indefinite=False):
    g = torch.Generator().manual_seed(seed)
    X = (
        torch.randn(n, d_in, generator=g, dtype=torch.float64) * torch.rand(d_in, generator=g, dtype=torch.float64)
        + 0.3
    )
    G = X.T @ X
    if indefinite:
        G = G - 0.5 * float(torch.linalg.eigvalsh(G).max()) * torch.eye(d_in, dtype=torch.float64)
    W0 = (0.1 * torch.randn(d_out, d_in, generator=g, dtype=torch.float64)).float()
    keep = torch.sort(torch.randperm(d_in, generator=g)[:k]).values
    return W0, G.float(), X.mean(0).float(), keep, float(n)


def _run(W0, G, mean, keep, n, method, check=None):
    opts = {"ridge": 0.01} if method == "lstsq" else {}
    out = compensate(W0, G, mean, keep, method, n_tokens=n, check=check, **opts)
    info = {k: v for k, v in out.info.items() if k != "seconds"}
    return out, info


def _same(a, b):
    assert torch.equal(a[0].weight, b[0].weight)
    assert (a[0].bias is None) == (b[0].bias is None)
    if a[0].bias is not None:
        assert torch.equal(a[0].bias, b[0].bias)
    assert a[1] == b[1]  # every reported number, to the bit


@pytest.mark.parametrize("indefinite", [False, True])
@pytest.mark.parametrize("method", METHODS)
def test_a_job_reading_the_check_gives_the_bits_of_one_forming_it(method, indefinite):
    W0, G, mean, keep, n = _problem(indefinite=indefinite)
    check = GramCheck.from_json(json.loads(json.dumps(check_module(W0, G).to_json())))  # through its file
    assert check.psd["indefinite"] is indefinite
    _same(_run(W0, G, mean, keep, n, method), _run(W0, G, mean, keep, n, method, check))


def test_a_fitting_check_skips_the_psd_check_and_the_energy_product(monkeypatch):
    W0, G, mean, keep, n = _problem(d_in=64, k=40)
    check = check_module(W0, G)
    calls = {"psd": 0, "energy": 0, "metric": 0}
    gram_psd, output_energy, normalize = method_module.gram_psd, errors.output_energy, method_module.normalize_gram_

    def counting_psd(*a, **k):
        calls["psd"] += 1
        return gram_psd(*a, **k)

    def counting_metric(*a, **k):
        calls["metric"] += 1
        return normalize(*a, **k)

    def counting_energy(*a, **k):
        calls["energy"] += 1
        return output_energy(*a, **k)

    monkeypatch.setattr(method_module, "gram_psd", counting_psd)
    monkeypatch.setattr(errors, "output_energy", counting_energy)  # the residual's
    monkeypatch.setattr(method_module, "output_energy", counting_energy)  # W0's (prepare)
    monkeypatch.setattr(method_module, "normalize_gram_", counting_metric)
    for method in ("none", "bias"):  # they keep W0[:, K]: not even the whole float64 metric
        _run(W0, G, mean, keep, n, method, check)
    assert calls == {"psd": 0, "energy": 0, "metric": 0}
    _run(W0, G, mean, keep, n, "lstsq", check)  # solves on the metric: formed, no App. B check,
    assert calls == {"psd": 0, "energy": 1, "metric": 1}  # one product: its residual's, not W0's
    _run(W0, G, mean, keep, n, "none")
    assert calls == {"psd": 1, "energy": 2, "metric": 2}  # without it: one of each per module


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_the_metric_block_from_the_gram_alone_has_the_bits_of_the_whole_metric(dtype):
    W0, G, _, keep, _ = _problem(d_in=70, k=41)
    G = G.to(dtype)
    G = G + 1e-3 * torch.rand(G.shape, generator=torch.Generator().manual_seed(1), dtype=dtype)  # not symmetric
    G[3, 5] = -0.0
    check = check_module(W0, G)
    idx = torch.tensor([0, 3, 5, 17, 40, 69])
    lean = prepare(Problem(W0=W0, gram=G, mean=None, keep=keep), check, metric=False, errors=True)
    block = lean.metric_block(idx)
    assert lean.metric is None  # the check stands in: the whole metric is never formed
    metric = form_metric(G, W0.device)
    whole = metric.G[idx[:, None], idx]
    assert torch.equal(block, whole) and torch.equal(torch.signbit(block), torch.signbit(whole))
    assert lean.scale == metric.scale
    assert torch.equal(lean.metric_whole(), metric.G)


@pytest.mark.parametrize("stale", ["gram", "weight"])
def test_a_check_of_other_data_is_not_used_and_the_log_says_so(stale, caplog):
    W0, G, mean, keep, n = _problem()
    check = check_module(W0, G)
    if stale == "gram":
        G = G.clone()
        G[:5, :5] *= 1.01  # same diagonal order of magnitude, another Gram
        G = 0.5 * (G + G.mT)
    else:
        W0 = W0.clone()
        W0[0] *= 2.0  # a weight changed after the check was formed
    with caplog.at_level(logging.WARNING, logger="coec.compensate.problem"):
        got = _run(W0, G, mean, keep, n, "bias", check)
    assert f"formed from another {stale}" in caplog.text.lower()
    _same(got, _run(W0, G, mean, keep, n, "bias"))


def test_the_check_is_the_metric_and_energy_the_job_would_form():
    W0, G, _, _, _ = _problem(d_out=16, d_in=40)
    chk = check_module(W0, G)
    G64 = G.double()
    G64 = 0.5 * (G64 + G64.mT)
    scale = float(torch.diagonal(G64).sum()) / G.shape[0]
    assert chk.scale == pytest.approx(scale, rel=1e-14)
    want = float(torch.trace(W0.double() @ (G64 / scale) @ W0.double().mT))
    assert chk.energy == pytest.approx(want, rel=1e-12)
    assert chk.gram_norm == pytest.approx(float(G64.norm()), rel=1e-12)
    assert chk.weight_norm == pytest.approx(float(W0.double().norm()), rel=1e-12)
    assert chk.psd == {"indefinite": False}
    assert chk.fits_gram(G) and chk.fits_weight(W0)
    assert not chk.fits_gram(G * (1 + 1e-6))
    assert not chk.fits_weight(1.001 * W0)


@pytest.mark.parametrize(
    "bad,key",
    [
        ({"gram_norm": "x"}, "gram_norm"),
        ({"scale": None}, "scale"),
        ({"weight_norm": True}, "weight_norm"),
        ({"energy": "1.0"}, "energy"),
        ({"psd": {}}, "psd.indefinite"),
    ],
)
def test_a_bad_check_entry_names_its_key(bad, key):
    W0, G, _, _, _ = _problem()
    obj = {**check_module(W0, G).to_json(), **bad}
    with pytest.raises(ValueError, match=key):
        GramCheck.from_json(obj)
