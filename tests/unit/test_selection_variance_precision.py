"""Channel variance from stored statistics: Σx² is stored in float64 beside a float32 Gram, so
the variance does not cancel on channels whose mean dominates their spread (m² >> Var)."""

from __future__ import annotations

import torch
from safetensors.torch import load_file, save_file

from coec.calibrate.layer_pass import GramAccumulator, channel_sumsq, gram_tensors
from coec.io.artifacts import read_gram_layer
from coec.iterative.stats import finalize_stats, mix_stats
from coec.model.arch import AttnShape
from coec.select.scores import KeepRule, channel_variance, column_scores, select_layer


def _offset_channels(n=4000, d=6, seed=0):
    """Activations whose channels sit at mean 10^j with unit spread: m²/Var up to 1e10."""
    g = torch.Generator().manual_seed(seed)
    means = torch.logspace(0, 5, d, dtype=torch.float64)
    return torch.randn(n, d, generator=g, dtype=torch.float64) + means


def _write(tmp_path, x, drop_sumsq=False):
    acc = GramAccumulator(x.shape[1], torch.device("cpu"))
    for chunk in x.split(1000):
        acc.update(chunk)
    t = gram_tensors({"o_proj": acc}, torch.float32)
    if drop_sumsq:  # a Gram file written before Σx² was stored
        del t["o_proj.sumsq"]
    save_file(t, str(tmp_path / "layer0.safetensors"))
    return read_gram_layer(tmp_path, 0, "o_proj")


def test_float64_sumsq_keeps_the_variance_of_offset_channels(tmp_path):
    x = _offset_channels()
    exact = x.var(0)
    st = _write(tmp_path, x)
    assert st["gram"].dtype == torch.float32 and st["sumsq"].dtype == torch.float64
    var = channel_variance(st["sumsq"], st["sum"], st["count"])
    torch.testing.assert_close(var, exact, rtol=1e-5, atol=0)
    # what the float32 Gram diagonal alone gives: wrong by orders of magnitude at m²/Var = 1e10
    bad = channel_variance(st["gram"].diagonal(), st["sum"], st["count"])
    assert float(((bad - exact).abs() / exact).max()) > 0.9  # clamped to 0 or far off
    # an old file without sumsq falls back to the Gram diagonal (the earlier behaviour)
    old = _write(tmp_path, x, drop_sumsq=True)
    assert torch.equal(old["sumsq"], st["gram"].diagonal().double())


def test_selection_scores_use_the_float64_sumsq(tmp_path):
    x = _offset_channels(d=8, seed=1)
    st = _write(tmp_path, x)
    w = torch.randn(5, 8, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    exact = column_scores("flap", w, (x**2).sum(0), x.sum(0), x.shape[0])
    geom = AttnShape(n_heads=2, n_kv=2, head_dim=4)
    keep = select_layer("flap", {"o_proj": w, "down_proj": w}, {"o_proj": st, "down_proj": st}, geom, KeepRule(0.5))
    want = sorted(torch.argsort(-exact)[:4].tolist())
    assert keep["channels"] == want
    fp32 = column_scores("flap", w, st["gram"].diagonal(), st["sum"], st["count"])
    assert sorted(torch.argsort(-fp32)[:4].tolist()) != want  # the test can fail


def test_mixed_sumsq_is_the_diagonal_of_the_float64_mixture():
    xs = [_offset_channels(300, 5, s) * (s + 1) for s in range(3)]
    per, per64 = [], []
    for x in xs:
        acc = GramAccumulator(5, torch.device("cpu"))
        acc.update(x)
        per64.append({"gram": acc.gram, "sum": acc.sum, "count": acc.count})
        per.append({"gram": acc.gram.float(), "sum": acc.sum, "sumsq": acc.sumsq, "count": acc.count})
    for how in ("pooled", "eq8"):
        full64 = mix_stats(per64, [0.5, 0.3, 0.2], how)
        mixed = mix_stats(per, [0.5, 0.3, 0.2], how)
        torch.testing.assert_close(mixed["sumsq"], full64["gram"].diagonal(), rtol=1e-12, atol=0)
        fin = finalize_stats(per, [0.5, 0.3, 0.2], how, "float32")
        assert fin["gram"].dtype == torch.float32 and torch.equal(fin["sumsq"], mixed["sumsq"])
    one = mix_stats(per[:1], [1.0])
    assert torch.equal(one["sumsq"], per[0]["sumsq"]) and torch.equal(channel_sumsq(one), per[0]["sumsq"])
    t = gram_tensors({"o_proj": finalize_stats(per, [1, 1, 1], "pooled", "float32")})
    assert t["o_proj.sumsq"].dtype == torch.float64


def test_gram_file_round_trip_keys(tmp_path):
    x = _offset_channels(100, 3)
    st = _write(tmp_path, x)
    keys = set(load_file(str(tmp_path / "layer0.safetensors")))
    assert keys == {"o_proj.gram", "o_proj.sum", "o_proj.sumsq", "o_proj.abssum", "o_proj.count"}
    torch.testing.assert_close(st["sumsq"], (x**2).sum(0), rtol=1e-14, atol=0)


def test_sumsq_is_read_without_mirroring_and_equals_the_gram_diagonal():
    x = _offset_channels(700, 600, seed=3)  # several block rows at the CPU block of 256
    acc = GramAccumulator(600, torch.device("cpu"))
    for chunk in x.split(300):
        acc.update(chunk)
        sq = acc.sumsq.clone()
        assert not acc._mirrored  # read straight from the upper-triangle accumulation
        assert torch.equal(sq, acc.gram.diagonal())
    torch.testing.assert_close(acc.sumsq, (x**2).sum(0), rtol=1e-14, atol=0)
