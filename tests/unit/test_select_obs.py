"""The obs selection (coec.select.obs, docs/obs.md): its predicted error is lstsq's refit error,
each greedy step's increase is a brute-force refit's, the downdate matters, it beats the paper
scores after the refit, whole KV-group blocks, KeepRule's counts, its options and the config."""

import copy

import pytest
import torch

from coec.compensate import compensate
from coec.config.validate import SCHEMA, ConfigError, schema_default, validate_config
from coec.model.arch import AttnShape, o_proj_columns
from coec.select import obs
from coec.select.scores import (
    SCORES,
    KeepRule,
    aligned_keep,
    column_scores,
    n_keep,
    select_layer,
    selection_registry,
    selection_spec,
    top_k_sorted,
)

F64 = torch.float64
GEOM = AttnShape(n_heads=8, n_kv=4, head_dim=3)  # o_proj: 24 columns, 4 blocks of 6


def inputs(n: int, d: int, g: torch.Generator, rank: int = 8) -> torch.Tensor:
    """(n, d) correlated, heavy-tailed inputs: ``rank`` shared factors and each channel's own
    part, both scale mixtures of Gaussians (log-normal scales), per-channel scales and means."""

    def heavy(*shape: int) -> torch.Tensor:
        scale = torch.exp(0.9 * torch.randn(*shape, generator=g, dtype=F64))
        return torch.randn(*shape, generator=g, dtype=F64) * scale

    X = heavy(n, rank) @ torch.randn(rank, d, generator=g, dtype=F64) / rank**0.5 + 0.5 * heavy(n, d)
    return X * torch.exp(0.5 * torch.randn(d, generator=g, dtype=F64)) + 0.3 * torch.randn(d, generator=g, dtype=F64)


def stats(X: torch.Tensor) -> dict:
    """A module's calibration statistics as ``read_gram_layer`` gives them."""
    G = X.mT @ X
    return {"gram": G, "sum": X.sum(0), "sumsq": G.diagonal().clone(), "count": X.shape[0], "mean": X.mean(0)}


def layer(seed: int, n: int = 300, d_model: int = 12, d_ff: int = 40):
    """A random layer (weights, stats, X per module) of GEOM's attention and a d_ff-wide MLP."""
    g = torch.Generator().manual_seed(seed)
    X = {"o_proj": inputs(n, GEOM.n_heads * GEOM.head_dim, g), "down_proj": inputs(n, d_ff, g)}
    W = {m: torch.randn(d_model, x.shape[1], generator=g, dtype=F64) for m, x in X.items()}
    return W, {m: stats(x) for m, x in X.items()}, X


def ridge_objective(W: torch.Tensor, X: torch.Tensor, cols: list[int], lam: float) -> float:
    """min_V ||X Wᵀ − X_R Vᵀ||² + λ||V||², brute force from the tokens: least squares on the
    system augmented by √λ I (R = ``cols``)."""
    XR = X[:, cols]
    A = torch.cat([XR, lam**0.5 * torch.eye(len(cols), dtype=F64)])
    B = torch.cat([X @ W.mT, torch.zeros(len(cols), W.shape[0], dtype=F64)])
    Vt = torch.linalg.lstsq(A, B).solution
    return float(((A @ Vt - B) ** 2).sum())


def unit_cols(units, block: int) -> list[int]:
    return [u * block + j for u in sorted(units) for j in range(block)]


def check_steps(W, X, res: obs.ObsResult, block: int, damp: float, batch: int, argmin: bool = True) -> None:
    """Every step's increase is the brute-force refit's; with ``argmin`` (batch 1) each step
    removes the unit whose removal the brute force finds cheapest. AssertionError otherwise."""
    G = X.mT @ X
    lam = damp * float(G.diagonal().mean())
    n_units = W.shape[1] // block
    alive = set(range(n_units))
    before = ridge_objective(W, X, unit_cols(alive, block), lam)
    steps = [res.removed[i : i + batch] for i in range(0, len(res.removed), batch)]
    assert len(steps) == len(res.increases)
    for units, inc in zip(steps, res.increases):
        if argmin:
            trial = {u: ridge_objective(W, X, unit_cols(alive - {u}, block), lam) for u in sorted(alive)}
            assert units == [min(trial, key=trial.__getitem__)]
        alive -= set(units)
        after = ridge_objective(W, X, unit_cols(alive, block), lam)
        assert inc == pytest.approx(after - before, rel=1e-7, abs=1e-10 * before)
        before = after
    assert sorted(alive) == res.keep


@pytest.mark.parametrize("damp", [0.0, 0.01])
def test_predicted_error_is_the_lstsq_refit(damp):
    """obs + lstsq with obs's λ (ridge = damp · mean diag G / mean diag G_RR; 0 at damp 0)
    reproduces keep.json's predicted error from the Grams (compensate's relerr_after)."""
    W, S, _ = layer(0)
    spec = {"score": "obs", "damp": damp, "batch": 3}
    keep = select_layer(spec, W, S, GEOM, KeepRule(0.5))
    pred = keep["predicted_relerr"]
    for module, cols in (
        ("o_proj", o_proj_columns(keep["kv_groups"], GEOM)),
        ("down_proj", torch.tensor(keep["channels"])),
    ):
        st = S[module]
        diag = st["gram"].diagonal()
        ridge = damp * float(diag.mean() / diag[cols].mean())
        info = compensate(W[module], st["gram"], st["mean"], cols, "lstsq", n_tokens=st["count"], ridge=ridge).info
        assert info["relerr_after"] == pytest.approx(pred[module], rel=1e-6)
        assert 0 < pred[module] < info["relerr_before"]


@pytest.mark.parametrize("block, batch", [(1, 1), (1, 3), (4, 1)])
def test_each_step_is_a_brute_force_refit(block, batch):
    g = torch.Generator().manual_seed(1)
    X = inputs(200, 16, g)
    W = torch.randn(6, 16, generator=g, dtype=F64)
    for damp in (0.0, 0.05):
        res = obs.obs_prune(W, X.mT @ X, 16 // block // 2 if block > 1 else 6, block=block, damp=damp, batch=batch)
        check_steps(W, X, res, block, damp, batch, argmin=batch == 1)
        cols = unit_cols(res.keep, block)
        # the weight carried through the downdates is the refit: zero where pruned
        assert torch.count_nonzero(res.weight[:, [c for c in range(16) if c not in cols]]) == 0


def _skip_schur(Hinv, V, cols):
    """A broken downdate: V updated, H⁻¹ only zeroed at the removed columns (no Schur complement)."""
    rows = Hinv[cols]
    K = torch.linalg.solve(rows[:, cols], rows)
    VS = V[:, cols]
    inc = float((VS.mT * torch.linalg.solve(rows[:, cols], VS.mT)).sum())
    V.addmm_(VS, K, alpha=-1.0)
    V[:, cols] = 0.0
    Hinv[cols] = 0.0
    Hinv[:, cols] = 0.0
    return inc


def _skip_all(Hinv, V, cols):
    """A broken downdate: nothing updated, the removed columns only zeroed."""
    VS = V[:, cols]
    inc = float((VS.mT * torch.linalg.solve(Hinv[cols][:, cols], VS.mT)).sum())
    V[:, cols] = 0.0
    Hinv[cols] = 0.0
    Hinv[:, cols] = 0.0
    return inc


@pytest.mark.parametrize("broken", [_skip_schur, _skip_all])
def test_the_checks_fail_without_the_downdate(monkeypatch, broken):
    """The brute-force and lstsq checks above catch a greedy that skips the downdate."""
    g = torch.Generator().manual_seed(1)
    X = inputs(200, 16, g)
    W = torch.randn(6, 16, generator=g, dtype=F64)
    G = X.mT @ X
    good = obs.obs_prune(W, G, 6, damp=0.01)
    monkeypatch.setattr(obs, "downdate", broken)
    bad = obs.obs_prune(W, G, 6, damp=0.01)
    with pytest.raises(AssertionError):
        check_steps(W, X, bad, 1, 0.01, 1)
    # and keep.json's prediction would not be the refit's error
    cols = torch.tensor(bad.keep)
    ridge = 0.01 * float(G.diagonal().mean() / G.diagonal()[cols].mean())
    info = compensate(W, G, X.mean(0), cols, "lstsq", n_tokens=200, ridge=ridge).info
    assert bad.relerr != pytest.approx(info["relerr_after"], rel=1e-6)
    assert good.relerr < bad.relerr


def refit_error(W, G, cols) -> float:
    """relerr after lstsq's refit (its default ridge) of the kept columns ``cols``."""
    return compensate(W, G, None, torch.as_tensor(cols), "lstsq").info["relerr_after"]


def test_obs_beats_the_paper_scores_after_the_refit():
    """At the same kept count, obs's keep set refit by lstsq errs less than each paper score's in
    at least 95 % of random layers with correlated, heavy-tailed inputs."""
    draws, wins = 40, dict.fromkeys(("wanda_sp", "flap", "rcpu"), 0)
    for seed in range(draws):
        g = torch.Generator().manual_seed(100 + seed)
        X = inputs(256, 48, g)
        W = torch.randn(16, 48, generator=g, dtype=F64)
        st = stats(X)
        k = 24
        mine = refit_error(W, st["gram"], obs.obs_prune(W, st["gram"], k, batch=2).keep)
        for name in wins:
            theirs = top_k_sorted(column_scores(name, W, st["sumsq"], st["sum"], st["count"]), k)
            wins[name] += mine < refit_error(W, st["gram"], theirs)
    assert all(w >= 0.95 * draws for w in wins.values()), wins


@pytest.mark.parametrize(
    "rule",
    [
        KeepRule(0.3),
        KeepRule(0.3, group_rounding="nearest"),
        KeepRule(0.5, channel_multiple=8, channel_rounding="floor"),
        KeepRule(0.3, channel_multiple=8, channel_rounding="nearest"),
        KeepRule(0.6, channel_multiple=16, channel_rounding="ceil"),
    ],
)
def test_keep_rule_counts_and_whole_groups(rule):
    W, S, _ = layer(2)
    keep = select_layer("obs", W, S, GEOM, rule)
    paper = select_layer("rcpu", W, S, GEOM, rule)
    assert len(keep["kv_groups"]) == len(paper["kv_groups"]) == n_keep(GEOM.n_kv, rule.ratio, rule.group_rounding)
    n = aligned_keep(40, rule.ratio, rule.channel_multiple, rule.channel_rounding)
    assert len(keep["channels"]) == len(paper["channels"]) == n
    assert keep["channels"] == sorted(set(keep["channels"])) and keep["kv_groups"] == sorted(set(keep["kv_groups"]))
    # o_proj: whole blocks of a group's query heads' columns, zero in the refit where pruned
    block = GEOM.groups * GEOM.head_dim
    res = obs.obs_prune(W["o_proj"], S["o_proj"]["gram"], len(keep["kv_groups"]), block=block)
    assert res.keep == keep["kv_groups"]
    per_unit = res.weight.abs().sum(0).view(GEOM.n_kv, block)
    for u in range(GEOM.n_kv):
        assert bool((per_unit[u] > 0).all()) == (u in res.keep) and bool((per_unit[u] == 0).all()) != (u in res.keep)


def test_options_defaults_and_refusals():
    spec = selection_spec("obs")
    assert spec.options() == {k: schema_default(f"selections.*.{k}") for k in ("batch", "damp")}
    assert selection_spec({"score": "obs", "damp": 0, "batch": 4}).options() == {"batch": 4, "damp": 0.0}
    assert selection_spec(spec) == spec and SCORES["obs"].needs_gram and not SCORES["rcpu"].needs_gram
    for bad, match in (
        ({"damp": -1.0}, "damp"),
        ({"damp": float("nan")}, "damp"),
        ({"batch": 0}, "batch"),
        ({"batch": 2.5}, "batch"),
        ({"ridge": 1.0}, "unknown option 'ridge'"),
        ({"weight_norm": "l1_mean"}, "no column scores"),
    ):
        with pytest.raises(ValueError, match=match):
            selection_spec({"score": "obs", **bad})
    with pytest.raises(ValueError, match="unknown option 'damp'"):
        selection_spec({"score": "rcpu", "damp": 0.1})
    with pytest.raises(ValueError, match="no column scores"):
        column_scores("obs", torch.ones(2, 2), torch.ones(2), torch.ones(2), 3)
    with pytest.raises(ValueError, match="not positive definite"):
        obs.obs_prune(torch.ones(2, 3, dtype=F64), torch.ones(3, 3, dtype=F64), 1, damp=0.0)


def test_config_selections_and_defaults_from_the_schema():
    from pathlib import Path

    import yaml

    cfg = yaml.safe_load((Path(__file__).parents[2] / "config.yaml").read_text())
    cfg["selections"] = {**cfg.get("selections", {}), "obs-d0": {"score": "obs", "damp": 0}, "obs": {"score": "obs"}}
    cfg["table1"]["rows"].append({"selection": "obs-d0", "compensation": "lstsq"})
    cfg["table1"]["rows"].append({"selection": "obs", "compensation": "lstsq"})
    done = validate_config(copy.deepcopy(cfg), SCHEMA)
    assert done["selections"]["obs-d0"] == {"score": "obs", "damp": 0, "batch": schema_default("selections.*.batch")}
    reg = selection_registry(done["selections"])
    assert reg["obs"] == selection_spec("obs") and reg["obs-d0"].options()["damp"] == 0.0
    bad = copy.deepcopy(cfg)
    bad["selections"]["rcpu-d"] = {"score": "rcpu", "damp": 0.1}
    with pytest.raises(ConfigError, match="damp"):
        validate_config(bad, SCHEMA)
    bad = copy.deepcopy(cfg)
    bad["selections"]["obs-d0"]["batch"] = 0
    with pytest.raises(ConfigError, match="batch"):
        validate_config(bad, SCHEMA)
