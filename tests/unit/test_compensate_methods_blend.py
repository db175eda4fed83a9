"""The blend method (beyond the paper): intercept, affine ridge, held-out blend weight, limits."""

import pytest
import torch

from coec.compensate import compensate
from coec.compensate.blending import affine_ridge, augmented_gram, blend_weight, intercept
from coec.compensate.errors import OutputError

F64 = torch.float64


def stats(X: torch.Tensor):
    """(sum Gram, mean, count) of tokens X (n, d)."""
    return X.T @ X, X.mean(0), X.shape[0]


def problem(seed=0, d_in=24, d_out=10, n=200, offset=2.0):
    """Correlated inputs with a channel offset (so a bias matters), a weight, a keep set, and a
    calibration and a held-out sample of the same distribution."""
    g = torch.Generator().manual_seed(seed)
    A = torch.randn(d_in, d_in, generator=g, dtype=F64) / d_in**0.5
    mu = offset * torch.randn(d_in, generator=g, dtype=F64)
    draw = lambda m: torch.randn(m, d_in, generator=g, dtype=F64) @ A + mu  # noqa: E731
    W0 = torch.randn(d_out, d_in, generator=g, dtype=F64)
    keep = torch.sort(torch.randperm(d_in, generator=g)[: d_in * 2 // 3]).values
    return W0, draw(n), draw(n), keep


def base_of(W0, X, keep):
    """A stand-in for COEC's weights: prune-only plus noise (any (d_out, k) weight will do)."""
    g = torch.Generator().manual_seed(7)
    return W0[:, keep] + 0.1 * torch.randn(W0.shape[0], keep.numel(), generator=g, dtype=F64)


def run(W0, X, H, keep, **opts):
    G, m, n = stats(X)
    Gh, mh, nh = stats(H)
    inputs = dict(base_weight=base_of(W0, X, keep), holdout_gram=Gh, holdout_mean=mh, holdout_count=nh)
    inputs.update(opts.pop("inputs", {}))
    opts.setdefault("n_tokens", n)
    return compensate(W0.float(), G.float(), m.float(), keep, "blend", inputs=inputs, **opts)


def test_intercept_is_optimal_for_a_fixed_weight():
    W0, X, _, keep = problem()
    G, m, n = stats(X)
    W = base_of(W0, X, keep)
    b = intercept(W0, W, m, keep)
    best = OutputError(W0, G / n, keep, m, scale=1.0)(W, b)
    # the closed form equals the empirical mean residual, and beats every perturbed bias
    assert torch.allclose(b, (X @ W0.T - X[:, keep] @ W.T).mean(0))
    g = torch.Generator().manual_seed(1)
    for _ in range(50):
        assert (
            OutputError(W0, G / n, keep, m, scale=1.0)(W, b + 0.05 * torch.randn(b.shape, generator=g, dtype=F64))
            > best
        )


def test_affine_ridge_without_ridge_is_least_squares_with_an_intercept():
    W0, X, _, keep = problem(d_in=16, n=400)
    G, m, n = stats(X)
    W, b = affine_ridge(W0, G / n, m, keep, 0.0)
    Xa = torch.cat([X[:, keep], torch.ones(n, 1, dtype=F64)], dim=1)
    sol = torch.linalg.lstsq(Xa, X @ W0.T).solution.T  # [W, b] of ordinary least squares
    assert torch.allclose(W, sol[:, :-1], atol=1e-8) and torch.allclose(b, sol[:, -1], atol=1e-8)


def test_augmented_gram_is_the_second_moment_of_x_and_one():
    _, X, _, _ = problem()
    G, m, n = stats(X)
    Xa = torch.cat([X, torch.ones(n, 1, dtype=F64)], dim=1)
    assert torch.allclose(augmented_gram(G / n, m), Xa.T @ Xa / n)


def test_blend_weight_minimises_the_heldout_error_over_beta():
    W0, X, H, keep = problem()
    G, m, n = stats(X)
    Gh, mh, nh = stats(H)
    Wb = base_of(W0, X, keep)
    base = (Wb, intercept(W0, Wb, m, keep))
    ridge = affine_ridge(W0, G / n, m, keep, 1e-2)
    beta, info = blend_weight(W0, base, ridge, Gh / nh, mh, keep)

    heldout = OutputError(W0, Gh / nh, keep, mh, scale=1.0)

    def err(t):
        return heldout((1 - t) * base[0] + t * ridge[0], (1 - t) * base[1] + t * ridge[1])

    assert 0.0 < beta < 1.0 and info["unclipped"] == pytest.approx(beta)
    grid = (
        torch.linspace(0, 1, 201).tolist()
        + torch.rand(50, generator=torch.Generator().manual_seed(3), dtype=F64).tolist()
    )
    assert all(err(beta) <= err(t) + 1e-12 for t in grid)
    # and the error really is measured on the held-out tokens: the empirical mean squared residual
    t = beta
    Wt, bt = (1 - t) * base[0] + t * ridge[0], (1 - t) * base[1] + t * ridge[1]
    emp = ((H @ W0.T - H[:, keep] @ Wt.T - bt) ** 2).sum(1).mean() / ((H @ W0.T) ** 2).sum(1).mean()
    assert err(beta) == pytest.approx(float(emp), rel=1e-9)


def test_blend_is_never_worse_on_heldout_than_either_end():
    for seed in range(5):
        W0, X, H, keep = problem(seed=seed, n=60 + 40 * seed)
        info = run(W0, X, H, keep).info
        assert info["heldout_relerr"] <= min(info["heldout_relerr_base"], info["heldout_relerr_ridge"]) + 1e-7


def test_limits_reduce_to_the_base_and_to_lstsq_bit_for_bit():
    W0, X, H, keep = problem()
    G, m, n = stats(X)
    Wb = base_of(W0, X, keep).float()
    base = run(W0, X, H, keep, mix="base", intercept=False, inputs={"base_weight": Wb})
    assert torch.equal(base.weight, Wb) and base.bias is None
    ridge = run(W0, X, H, keep, mix="ridge", intercept=False)
    ref = compensate(W0.float(), G.float(), m.float(), keep, "lstsq", ridge=1e-2, n_tokens=n)
    assert torch.equal(ridge.weight, ref.weight) and ridge.bias is None
    # with the intercept, the base end keeps the base weight and adds the best bias
    b = run(W0, X, H, keep, mix="base", inputs={"base_weight": Wb})
    assert torch.equal(b.weight, Wb)
    assert torch.allclose(b.bias.double(), intercept(W0, Wb.double(), m, keep), atol=1e-5)


def test_intercept_lowers_the_calibration_error():
    W0, X, H, keep = problem()
    with_b = run(W0, X, H, keep, mix="ridge")
    without = run(W0, X, H, keep, mix="ridge", intercept=False)
    assert with_b.info["relerr_after"] < without.info["relerr_after"]


def test_deterministic():
    W0, X, H, keep = problem()
    a, b = run(W0, X, H, keep), run(W0, X, H, keep)
    assert torch.equal(a.weight, b.weight) and torch.equal(a.bias, b.bias) and a.info["beta"] == b.info["beta"]


@pytest.mark.parametrize(
    "opts, needle",
    [
        ({"inputs": {"base_weight": None}}, "requires base_weight"),
        ({"inputs": {"holdout_gram": None}}, "requires holdout_gram"),
        ({"n_tokens": None}, "requires n_tokens"),
        ({"inputs": {"base_weight": torch.zeros(3, 3)}}, "base_weight shape"),
        ({"mix": "best"}, "mix"),
    ],
)
def test_bad_options_are_refused(opts, needle):
    W0, X, H, keep = problem()
    with pytest.raises(ValueError, match=needle):
        run(W0, X, H, keep, **opts)


def test_config_validation_names_a_bad_blend_key():
    from coec.compensate.options import validate_spec

    validate_spec({"method": "blend", "base": "coec", "holdout": "h"}, "compensations.blend")
    with pytest.raises(ValueError, match=r"compensations.blend.holdot: unknown option"):
        validate_spec({"method": "blend", "holdot": "h"}, "compensations.blend")
    with pytest.raises(ValueError, match=r"compensations.blend.base_weight: unknown option 'base_weight'"):
        validate_spec({"method": "blend", "base_weight": 1}, "compensations.blend")  # data, not an option


def test_disjoint_windows_share_no_token_and_leave_plain_sampling_unchanged():
    from coec.data.text import sample_windows, window_starts

    tokens = torch.arange(5000)
    plain = sample_windows(tokens, 16, 64, 0)
    assert torch.equal(plain[:, 0], window_starts(5000, 16, 64, 0))  # the same draw as before
    held = sample_windows(tokens, 12, 48, 1, exclude={"nsamples": 16, "seqlen": 64, "seed": 0})
    assert held.shape == (12, 48)
    assert not set(held.flatten().tolist()) & set(plain.flatten().tolist())
    again = sample_windows(tokens, 12, 48, 1, exclude={"nsamples": 16, "seqlen": 64, "seed": 0})
    assert torch.equal(held, again)
    with pytest.raises(ValueError, match="disjoint"):
        sample_windows(torch.arange(200), 4, 64, 1, exclude={"nsamples": 40, "seqlen": 64, "seed": 0})


@pytest.mark.parametrize(
    "cal, needle",
    [({"disjoint_from": "nope"}, "unknown calibration"), ({"disjoint_from": "c8"}, "another calibration set")],
)
def test_config_refuses_a_bad_disjoint_from(cal, needle, tmp_path):
    from coec.config.validate import ConfigError, validate_config
    from conftest import write_trimmed_workflow

    cfg, _ = write_trimmed_workflow(tmp_path)
    cfg["calibration"]["c8"].update(cal)
    with pytest.raises(ConfigError, match=needle):
        validate_config(cfg)
