"""The KL-to-dense estimate (``coec.evaluate.kl``) on random logits: exact when the top-k covers
the vocabulary, a lower bound with the rest as one bucket, unbiased with samples of the rest, 0
for a model against itself, independent of the chunking and of 16-bit logits' upcast; the window
digest sees a shift by one token."""

from __future__ import annotations

import pytest
import torch

from coec.evaluate.kl import KlMeter, RowsBuilder, exact_summed_kl, reference_rows, summed_kl, windows_sha256


def logits_pair(b=2, T=33, V=300, noise=0.5, seed=0):
    g = torch.Generator().manual_seed(seed)
    p = 3 * torch.randn(b, T, V, generator=g)
    return p, p + noise * torch.randn(b, T, V, generator=g)


def test_top_k_over_the_vocabulary_is_exact():
    p, q = logits_pair()
    rows = reference_rows(p, 300, 64)
    assert rows.top_k == 300 and rows.tail_samples == 0  # nothing is left to sample
    assert float(summed_kl(q, rows)) == pytest.approx(float(exact_summed_kl(p, q)), rel=1e-9)


def test_self_kl_is_zero_exactly():
    p, _ = logits_pair()
    for k, m in ((300, 0), (16, 0), (16, 16)):
        assert float(summed_kl(p, reference_rows(p, k, m))) == 0.0


def test_the_rest_as_a_bucket_is_a_lower_bound_and_samples_remove_the_bias():
    p, q = logits_pair(b=4, T=129, V=500, noise=1.0)
    exact = float(exact_summed_kl(p, q))
    bound = [float(summed_kl(q, reference_rows(p, k, 0))) for k in (4, 32, 128)]
    assert bound[0] < bound[1] < bound[2] < exact
    draws = [float(summed_kl(q, reference_rows(p, 32, 32, torch.Generator().manual_seed(s)))) for s in range(8)]
    mean = sum(draws) / len(draws)
    assert abs(mean / exact - 1) < 0.01 < abs(bound[1] / exact - 1)


def test_chunking_and_16_bit_logits():
    p, q = logits_pair(T=40)
    rows = reference_rows(p, 20, 8)
    assert float(summed_kl(q, rows, chunk_tokens=7)) == pytest.approx(float(summed_kl(q, rows)), rel=1e-12)
    assert reference_rows(p, 20, 8, chunk_tokens=5).ids.equal(rows.ids)
    half = summed_kl(q.half(), rows)
    assert half.dtype == torch.float64 and float(half) == pytest.approx(
        float(summed_kl(q.half().float(), rows)), rel=1e-12
    )


def test_the_meter_takes_batches_in_any_order_and_checks_them():
    p, q = logits_pair(b=4, T=17, V=50)
    builder = RowsBuilder(4, 10, 4)
    for s in (2, 0):
        builder(s, None, p[s : s + 2])
    rows = builder.rows()
    meter = KlMeter(rows)
    meter(2, None, q[2:4])
    with pytest.raises(ValueError, match="positions were scored"):
        meter.mean()
    meter(0, None, q[0:2])
    assert meter.mean() == pytest.approx(float(summed_kl(q, rows)) / (4 * 16), rel=1e-12)
    with pytest.raises(ValueError, match="vocabulary 50"):
        meter(0, None, q[0:2, :, :40])
    with pytest.raises(ValueError, match="not in the KL reference"):
        meter(3, None, q[0:2])


def test_window_digest_sees_a_shift_by_one_token():
    tokens = torch.arange(1000) % 97
    w = tokens[:960].view(30, 32)
    assert windows_sha256(w) == windows_sha256(w.clone().to(torch.int32))
    assert windows_sha256(w) != windows_sha256(tokens[1:961].view(30, 32))
    assert windows_sha256(w) != windows_sha256(w[:29]) != windows_sha256(tokens[:960].view(60, 16))
