"""coec.select.search.fitness.token_kl: KL(p || q) per row against a float64 reference, the same in
any chunking, 0 for identical distributions, float64 in and out where the inputs are."""

from __future__ import annotations

import pytest
import torch

from coec.select.search.fitness import log_probs, mean_kl, token_kl


def test_token_kl_is_the_kl_divergence_in_any_chunking():
    g = torch.Generator().manual_seed(0)
    p_logits, q_logits = torch.randn(7, 50, generator=g), torch.randn(7, 50, generator=g)
    lp, lq = torch.log_softmax(p_logits.double(), -1), torch.log_softmax(q_logits.double(), -1)
    want = (lp.exp() * (lp - lq)).sum(-1)
    ref = log_probs(p_logits)
    assert ref.dtype == torch.float32
    for chunk in (1, 3, 7, 1024):
        got = token_kl(ref, q_logits, chunk)
        assert got.dtype == torch.float64 and got.shape == (7,)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    assert token_kl(lp, q_logits.double()).dtype == torch.float64
    torch.testing.assert_close(token_kl(lp, q_logits.double()), want, rtol=1e-12, atol=1e-12)
    assert mean_kl(ref, q_logits) == pytest.approx(float(want.mean()), rel=1e-5)
    assert (token_kl(ref, q_logits) >= 0).all()


def test_token_kl_of_a_distribution_to_itself_is_zero():
    logits = torch.randn(5, 33, generator=torch.Generator().manual_seed(1))
    assert float(token_kl(log_probs(logits), logits).abs().max()) < 1e-6
    with pytest.raises(ValueError, match="differ in shape"):
        token_kl(log_probs(logits), logits[:, :-1])
